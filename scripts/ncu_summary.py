#!/usr/bin/env python3
"""One line per kernel launch of an Nsight Compute raw CSV (ncu --csv --page raw): grid,
duration, L2 throughput %, tensor-pipe activity (gmma / hmma) %, shared-memory bank
conflicts (ld + st). scripts/gpu-check.sh appends it to summary.txt under --focus.

Usage: scripts/ncu_summary.py ncu_raw.csv
"""
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline="")))
head, data = rows[0], rows[2:]  # row 1: units
col = {name: i for i, name in enumerate(head)}
def get(row, *names):
    for n in names:
        if n in col and row[col[n]] not in ("", "n/a"):
            return row[col[n]]
    return "-"
for r in data:
    name = get(r, "Kernel Name")[:60]
    bank = "-"
    try:
        bank = str(int(float(get(r, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum").replace(",", "")) +
                       float(get(r, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum").replace(",", ""))))
    except ValueError:
        pass
    print("  %-60s | %s | %s | %s | %s / %s | %s" % (
        name, get(r, "Grid Size", "launch__grid_size"), get(r, "gpu__time_duration.sum"),
        get(r, "lts__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sectors.avg.pct_of_peak_sustained_elapsed"),
        get(r, "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"),
        get(r, "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"), bank))
