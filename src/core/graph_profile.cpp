// profile_graph: a captured CUDA graph timed prefix by prefix (graph_profile.h).
#include "core/graph_profile.h"

#include "core/error.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#ifdef HEARTH_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#endif

namespace hearth::compat {

#ifdef HEARTH_WITH_CUDA
namespace {

void check(cudaError_t e, const char* what) {
  HEARTH_CHECK(e == cudaSuccess, "graph profile: ", what, ": ", cudaGetErrorString(e));
}

// The driver functions that name a kernel node, looked up once through the runtime.
struct DriverNames {
  using GetParams = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);
  using FuncName = CUresult (*)(const char**, CUfunction);
  using KernelName = CUresult (*)(const char**, CUkernel);
  GetParams get_params = nullptr;
  FuncName func_name = nullptr;
  KernelName kernel_name = nullptr;
  DriverNames() {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetParams", &p, 12000, cudaEnableDefault, &q) == cudaSuccess && p)
      get_params = reinterpret_cast<GetParams>(p);
    p = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuFuncGetName", &p, 12030, cudaEnableDefault, &q) == cudaSuccess && p)
      func_name = reinterpret_cast<FuncName>(p);
    p = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuKernelGetName", &p, 12030, cudaEnableDefault, &q) == cudaSuccess && p)
      kernel_name = reinterpret_cast<KernelName>(p);
    (void)cudaGetLastError();
  }
};

// "void ns::kernel<...>(args)" → "ns::kernel<...>", at most 120 characters.
std::string short_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  for (size_t at; (at = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(at, 23);
  // Cut the argument list: the last "(" outside <...> and {...} (a lambda's "()" sits inside them).
  int depth = 0;
  size_t cut = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' || s[i] == '{') ++depth;
    if (s[i] == '>' || s[i] == '}') --depth;
    if (s[i] == '(' && depth == 0) cut = i;
  }
  if (cut != std::string::npos) s.resize(cut);
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  return s;
}

const char* kind_name(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeHost: return "host function";
    case cudaGraphNodeTypeGraph: return "child graph";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeMemAlloc: return "mem alloc";
    case cudaGraphNodeTypeMemFree: return "mem free";
    default: return "other";
  }
}

std::vector<cudaGraphNode_t> dependencies(cudaGraphNode_t n) {
  size_t count = 0;
#if CUDART_VERSION >= 13000
  // Edge data must be asked for: programmatic (PDL) edges are not default edges, and a query
  // without it fails for them (cudaErrorLossyQuery).
  const cudaError_t e = cudaGraphNodeGetDependencies(n, nullptr, nullptr, &count);  // the count only
  if (e == cudaErrorLossyQuery) (void)cudaGetLastError();
  else check(e, "cudaGraphNodeGetDependencies");
  std::vector<cudaGraphNode_t> deps(count);
  std::vector<cudaGraphEdgeData> edges(count);
  if (count) check(cudaGraphNodeGetDependencies(n, deps.data(), edges.data(), &count), "cudaGraphNodeGetDependencies");
#else
  check(cudaGraphNodeGetDependencies(n, nullptr, &count), "cudaGraphNodeGetDependencies");
  std::vector<cudaGraphNode_t> deps(count);
  if (count) check(cudaGraphNodeGetDependencies(n, deps.data(), &count), "cudaGraphNodeGetDependencies");
#endif
  deps.resize(count);
  return deps;
}

// The graph's nodes in an order that respects its edges (Kahn; ties in the order the graph lists them).
std::vector<cudaGraphNode_t> run_order(cudaGraph_t g) {
  size_t count = 0;
  check(cudaGraphGetNodes(g, nullptr, &count), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(count);
  if (count) check(cudaGraphGetNodes(g, nodes.data(), &count), "cudaGraphGetNodes");
  nodes.resize(count);
  std::map<cudaGraphNode_t, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  std::vector<std::vector<size_t>> deps(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (cudaGraphNode_t d : dependencies(nodes[i])) deps[i].push_back(index.at(d));
  std::vector<bool> placed(nodes.size(), false);
  std::vector<cudaGraphNode_t> out;
  while (out.size() < nodes.size()) {
    bool progress = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (placed[i]) continue;
      if (!std::all_of(deps[i].begin(), deps[i].end(), [&](size_t d) { return placed[d]; })) continue;
      placed[i] = true;
      out.push_back(nodes[i]);
      progress = true;
      break;  // restart: keeps the listed order among ready nodes
    }
    HEARTH_CHECK(progress, "graph profile: the graph has a cycle");
  }
  return out;
}

// Mean time of one launch of the first `keep` nodes of `order` (a prefix of `g`), in µs.
double time_prefix(cudaGraph_t g, const std::vector<cudaGraphNode_t>& order, size_t keep, cudaStream_t stream,
                   int replays) {
  if (keep == 0) return 0.0;
  cudaGraph_t clone = nullptr;
  check(cudaGraphClone(&clone, g), "cudaGraphClone");
  std::unique_ptr<CUgraph_st, cudaError_t (*)(cudaGraph_t)> clone_guard(clone, cudaGraphDestroy);
  for (size_t i = keep; i < order.size(); ++i) {
    cudaGraphNode_t n = nullptr;
    check(cudaGraphNodeFindInClone(&n, order[i], clone), "cudaGraphNodeFindInClone");
    check(cudaGraphDestroyNode(n), "cudaGraphDestroyNode");
  }
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, clone, 0), "cudaGraphInstantiate");
  std::unique_ptr<CUgraphExec_st, cudaError_t (*)(cudaGraphExec_t)> exec_guard(exec, cudaGraphExecDestroy);
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  check(cudaEventCreate(&t0), "cudaEventCreate");
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> e0(t0, cudaEventDestroy);
  check(cudaEventCreate(&t1), "cudaEventCreate");
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> e1(t1, cudaEventDestroy);
  for (int i = 0; i < 3; ++i) check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check(cudaEventRecord(t0, stream), "cudaEventRecord");
  for (int i = 0; i < replays; ++i) check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check(cudaEventRecord(t1, stream), "cudaEventRecord");
  check(cudaEventSynchronize(t1), "cudaEventSynchronize");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, t0, t1), "cudaEventElapsedTime");
  return 1000.0 * ms / replays;
}

}  // namespace

std::vector<GraphNodeCost> profile_graph(void* graph, void* stream, int replays) {
  HEARTH_CHECK(graph != nullptr && replays > 0, "graph profile: no graph, or replays ", replays, " < 1");
  cudaGraph_t g = static_cast<cudaGraph_t>(graph);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  static const DriverNames driver;
  const std::vector<cudaGraphNode_t> order = run_order(g);
  std::vector<GraphNodeCost> out;
  double before = 0.0;
  for (size_t k = 0; k < order.size(); ++k) {
    GraphNodeCost c;
    cudaGraphNodeType type;
    check(cudaGraphNodeGetType(order[k], &type), "cudaGraphNodeGetType");
    c.name = kind_name(type);
    if (type == cudaGraphNodeTypeKernel && driver.get_params) {
      CUDA_KERNEL_NODE_PARAMS p{};
      if (driver.get_params(order[k], &p) == CUDA_SUCCESS) {
        const char* name = nullptr;
        if (p.func && driver.func_name) driver.func_name(&name, p.func);
        if (!name && p.kern && driver.kernel_name) driver.kernel_name(&name, p.kern);
        if (name) c.name = short_name(name);
        c.launch = cat(p.gridDimX, p.gridDimY > 1 ? cat("x", p.gridDimY) : "", p.gridDimZ > 1 ? cat("x", p.gridDimZ) : "",
                       " x ", p.blockDimX, p.blockDimY > 1 ? cat("x", p.blockDimY) : "");
      }
    }
    const double t = time_prefix(g, order, k + 1, s, replays);
    c.us = t - before;
    before = t;
    out.push_back(std::move(c));
  }
  return out;
}
#else
std::vector<GraphNodeCost> profile_graph(void*, void*, int) {
  throw Error("graph profile: this build has no CUDA");
}
#endif

std::string format_graph_profile(const std::vector<GraphNodeCost>& nodes) {
  double total = 0.0;
  struct Group {
    int count = 0;
    double us = 0.0;
  };
  std::map<std::string, Group> groups;
  for (const GraphNodeCost& n : nodes) {
    total += n.us;
    Group& g = groups[n.name];
    g.count += 1;
    g.us += n.us;
  }
  std::vector<std::pair<std::string, Group>> sorted(groups.begin(), groups.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "graph profile: %zu nodes, %.1f us per replay\n", nodes.size(), total);
  os << line;
  os << "  count        us   share  name\n";
  for (const auto& [name, g] : sorted) {
    std::snprintf(line, sizeof line, "  %5d  %8.1f  %5.1f%%  %s\n", g.count, g.us, total > 0 ? 100.0 * g.us / total : 0.0,
                  name.c_str());
    os << line;
  }
  os << "  node        us  launch            name\n";
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::snprintf(line, sizeof line, "  %4zu  %8.2f  %-16s  %s\n", i, nodes[i].us, nodes[i].launch.c_str(),
                  nodes[i].name.c_str());
    os << line;
  }
  return os.str();
}

}  // namespace hearth::compat
