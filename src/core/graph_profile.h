// Where a captured CUDA graph's time goes, node by node: a profiler for the decode step that needs
// no Nsight Systems (the GPU machine has none). Not the capture itself (core/cuda_graph.h).
#pragma once

#include <string>
#include <vector>

namespace hearth::compat {

/// One node of a profiled graph, in the order the graph runs them (topological; a stream capture
/// gives a chain). `us` is the node's marginal cost: the mean replay time of the graph cut after
/// this node minus that of the graph cut before it, in microseconds (so the costs sum to the whole
/// graph's replay time; a node that overlaps its neighbours, e.g. through programmatic dependent
/// launch, costs only what it adds).
struct GraphNodeCost {
  std::string name;  // kernel name (demangled, "void " and argument lists cut) or the node kind
  std::string launch;  // "grid x block" of a kernel node, "" for other kinds
  double us = 0.0;
};

/// Profiles `graph` (a cudaGraph_t, passed as void* so that CPU builds need no CUDA headers) on
/// `stream` (a cudaStream_t; nullptr: the legacy default stream): for each node k it clones the
/// graph, deletes the nodes after k, instantiates the prefix and times `replays` launches of it
/// with CUDA events (after 3 warm-up launches). The graph's work runs (N + 1) × (replays + 3) times,
/// so it must be idempotent (a decode step writing the same cache position again is; a recurrent
/// state is not). Returns the nodes in run order. Throws hearth::Error on a CUDA error, or always on
/// a build without CUDA. Names come from the driver (cuFuncGetName / cuKernelGetName, CUDA ≥ 12.3,
/// reached through cudaGetDriverEntryPointByVersion: no link to libcuda).
std::vector<GraphNodeCost> profile_graph(void* graph, void* stream, int replays);

/// A table of `nodes`: their sum (the whole graph's replay time), the totals per distinct name
/// (count, µs, share; largest first), then every node in run order.
std::string format_graph_profile(const std::vector<GraphNodeCost>& nodes);

}  // namespace hearth::compat
