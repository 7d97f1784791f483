// fattn-bench — output: the ceilings and results table on stdout, JSON, CSV.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "result.hpp"

namespace fattn_bench {

void print_machine(std::FILE* out, const Machine& machine);

// One line per (Sq, Sk, causal); for each quantity one column per impl, in the order
// the impls were asked for. Speedup (naive / fused time) when both ran.
void print_table(std::FILE* out, const Machine& machine, const std::vector<Result>& results);

// CPU time other processes (and the hypervisor) took during the run; a warning on
// stderr when it was enough to distort the figures.
void print_contention(std::FILE* out, const Machine& machine);

// A Markdown table's header row and its separator row.
void print_table_header(std::FILE* out, const std::vector<std::string>& columns);

// The schema in main.cpp's --help; throws std::runtime_error if the file cannot be written.
void write_json(const std::string& path, const Machine& machine,
                const std::vector<Result>& results);
// The "machine" object of the JSON documents (device, cpu, ceilings, date, ...).
nlohmann::ordered_json machine_json(const Machine& machine);
// The results, flat, with a header row.
void write_csv(const std::string& path, const std::vector<Result>& results);

// Current time, ISO 8601 in UTC: 2024-05-01T12:34:56Z.
std::string iso8601_now();

}  // namespace fattn_bench
