// fattn — what the decode kernel does with one problem, in words and numbers
// (fattn::DecodePlan, ForwardPlan::decode): how the scores of a key tile are computed,
// whether the cache is read in place, how the work is cut into items and key chunks, and
// the rules behind each choice. Every field is read from the objects the kernel itself
// runs on (DecodeWorkspace, DecodeOps::direct_scores, DecodeScoresBf16::direct_scores).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "model/problem.hpp"
#include "cpu/common/elements.hpp"
#include "cpu/decode/bf16.hpp"
#include "cpu/decode/ops.hpp"
#include "cpu/decode/workspace.hpp"

namespace fattn::cpu {

template <class S>
DecodePlan decode_plan(const detail::Problem& p, int workers, const DecodeRequest& request) {
  using Ops = DecodeOps<S>;
  using Workspace = DecodeWorkspace<S>;
  const Workspace ws(p, workers, request);
  DecodePlan plan;
  plan.reads_in_place = ws.in_place;
  plan.key_tile = Ops::Bk;
  plan.rows = ws.rows;
  plan.heads_per_item = ws.heads_per_item;
  plan.splits = ws.splits;
  plan.prefetch_tiles = ws.prefetch_tiles;
  plan.prefetch_level = ws.prefetch_level;
  plan.items = ws.items;

  // The scores of a full row tile (ws.tile_rows rows), as DecodeWorker::scores picks them.
  const bool dims_contiguous = !ws.in_place || p.k.dim == 1;
  // direct_for_rows(rows): the kernel's own rule; direct_up_to: the most rows it takes
  // directly, up to a row tile's.
  bool direct = false;
  std::int64_t direct_up_to = 0;
  auto follow = [&](auto direct_for_rows) {
    direct = direct_for_rows(ws.tile_rows);
    for (std::int64_t r = 1; r <= Workspace::kRowTile && direct_for_rows(r); ++r) direct_up_to = r;
  };
  std::string products;
#if defined(FATTN_AVX512_BF16)
  if (ws.dot_bf16 && ws.in_place && p.kv_dtype() == DType::bfloat16) {
    products = "bf16_dot ";
    follow([](std::int64_t rows) { return DecodeScoresBf16<S>::direct_scores(rows); });
  } else
#endif
  {
    follow([&](std::int64_t rows) { return Ops::direct_scores(rows, dims_contiguous); });
  }
  plan.scores = products + (ws.query_lanes ? "query_lanes" : direct ? "direct" : "transposed");

  std::ostringstream why;
  why << plan.scores << ": " << ws.tile_rows << " rows a tile (";
  if (ws.query_lanes)
    why << "48 or more take the query rows along the lanes";
  else if (direct_up_to > 0)
    why << "up to " << direct_up_to << " take the key rows where they lie, more a transposed tile";
  else
    why << "this instruction set transposes every tile";
  why << "); " << (ws.in_place ? "K and V read in place" : "K and V staged as float32 tile by tile")
      << " (" << (ws.in_place ? "contiguous dims, whole vectors" : "strided dims, a head dim not a "
                  "whole number of vectors, or a q8_0 cache under the query-lane tiles")
      << "); " << ws.heads_per_item << " of " << p.kv_heads << " kv heads an item (";
  if (ws.short_cache_heads)
    why << "dealt out among " << workers << " workers: under " << 2 * Workspace::kMinChunkKeys
        << " keys, too few to cut into chunks); ";
  else
    why << "their states" << (ws.in_place ? "" : " and staged tiles") << " within "
        << Workspace::kItemFloats << " floats); ";
  if (request.splits > 0)
    why << ws.splits << " key chunks as asked (kv_splits " << request.splits
        << ", at most one per key tile)";
  else
    why << ws.splits << " key chunks: " << ws.items / ws.splits << " items (batch × head groups × "
        << "row tiles) for " << workers << " workers, " << Workspace::kItemsPerWorker
        << " a worker wanted, chunks of at least " << Workspace::kMinChunkKeys << " keys";
  why << "; ";
  if (!ws.in_place)
    why << "no software prefetch (staged tiles)";
  else if (ws.prefetch_tiles == 0)
    why << "no software prefetch (decode_prefetch_tiles 0: the hardware prefetchers alone)";
  else
    why << "the rows " << ws.prefetch_tiles << " key tile" << (ws.prefetch_tiles > 1 ? "s" : "")
        << " ahead asked of memory during each tile's scores ("
        << (request.prefetch_tiles < 0 ? "the measured default" : "decode_prefetch_tiles as asked")
        << "), into " << (ws.prefetch_level == 2 ? "L2 (PREFETCHT1" : "L1 (PREFETCHT0") << ": "
        << (request.prefetch_level < 0 ? decode_prefetch_level_choice().reason
                                       : std::string("decode_prefetch_level as asked"))
        << ")";
  plan.reason = why.str();
  return plan;
}

}  // namespace fattn::cpu
