// BoundaryStore (train/boundary_store.h) on the CPU: offloaded fields come back bit-identical from
// host copies of their own (several pieces, a non-contiguous field), integer fields stay as given,
// a stream passed through consecutive edges is copied and counted once, the host limit keeps the
// later edges on the device, and misuse (taking twice, a wrong `previous`) is an error.
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/boundary_store.h"

using hearth::models::Boundary;
using hearth::train::BoundaryStore;
using hearth::train::BoundaryStoreOptions;

namespace {

BoundaryStoreOptions store_opts(bool offload, int64_t piece_bytes = 12, int64_t limit = 0) {
  BoundaryStoreOptions o;
  o.offload = offload;
  o.piece_bytes = piece_bytes;  // 3 floats: every field below spans several pieces
  o.host_limit_bytes = limit;
  return o;
}

Boundary store_edge(int64_t seed) {
  at::manual_seed(seed);
  Boundary b(at::randn({2, 5}));                           // 10 floats: pieces of 3, 3, 3, 1
  b.set("t", at::randn({4, 3}).t());                       // non-contiguous [3, 4]
  b.set("ids", at::randint(0, 9, {2, 5}, at::kLong));      // stays as given
  return b;
}

}  // namespace

TEST(BoundaryStore, OffloadedFieldsComeBackEqualFromTheirOwnCopies) {
  BoundaryStore store(store_opts(true));
  Boundary a = store_edge(1), b = store_edge(2);
  store.put(a);
  store.put(b, &a);
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.host_bytes(), 2 * (10 + 12) * 4);
  EXPECT_EQ(store.device_bytes(), 2 * 10 * 8);  // the int64 ids
  for (int i : {1, 0}) {
    const Boundary& src = i == 1 ? b : a;
    Boundary got = store.take(i);
    EXPECT_TRUE(at::equal(got.hidden, src.hidden));
    EXPECT_NE(got.hidden.data_ptr(), src.hidden.data_ptr());
    EXPECT_TRUE(at::equal(*got.find("t"), *src.find("t")));
    EXPECT_EQ(got.find("t")->sizes(), src.find("t")->sizes());
    EXPECT_EQ(got.find("ids")->data_ptr(), src.find("ids")->data_ptr());
    ASSERT_EQ(got.streams.size(), 2u);
    EXPECT_EQ(got.streams[0].first, "t");
  }
  EXPECT_EQ(store.host_bytes(), 0);
  EXPECT_EQ(store.peak_host_bytes(), 2 * (10 + 12) * 4);
}

TEST(BoundaryStore, PassedThroughStreamIsCopiedOnceAndSharedOnReturn) {
  BoundaryStore store(store_opts(true, 1 << 20));
  Boundary e0(at::randn({3, 4}));
  e0.set("pli", at::randn({3, 8}));
  Boundary e1(at::randn({3, 4}));
  e1.set("pli", e0.find("pli")->detach());  // a leaf() of the same tensor, as the forward makes
  e1.set("kv", at::randn({3, 2}));
  Boundary e2(at::randn({3, 4}));
  e2.set("pli", *e1.find("pli"));
  e2.set("kv", *e1.find("kv"));
  store.put(e0);
  store.put(e1, &e0);
  store.put(e2, &e1);
  EXPECT_EQ(store.host_bytes(), (3 * 12 + 24 + 6) * 4);
  Boundary g2 = store.take(2);
  store.prefetch(1);
  Boundary g1 = store.take(1), g0 = store.take(0);
  EXPECT_TRUE(at::equal(*g0.find("pli"), *e0.find("pli")));
  EXPECT_EQ(g2.find("pli")->data_ptr(), g0.find("pli")->data_ptr());  // brought back once
  EXPECT_EQ(g2.find("kv")->data_ptr(), g1.find("kv")->data_ptr());
  EXPECT_TRUE(at::equal(*g1.find("kv"), *e1.find("kv")));
}

TEST(BoundaryStore, KeptOnTheDeviceCountsASharedStorageOnce) {
  BoundaryStore store(store_opts(false));
  Boundary e0(at::randn({3, 4}));
  e0.set("pli", at::randn({3, 8}));
  Boundary e1(at::randn({3, 4}));
  e1.set("pli", *e0.find("pli"));
  store.put(e0);
  store.put(e1, &e0);
  EXPECT_EQ(store.host_bytes(), 0);
  EXPECT_EQ(store.device_bytes(), (2 * 12 + 24) * 4);
  EXPECT_EQ(store.take(1).hidden.data_ptr(), e1.hidden.data_ptr());  // as given
}

TEST(BoundaryStore, HostLimitKeepsLaterEdgesOnTheDevice) {
  BoundaryStore store(store_opts(true, 1 << 20, /*limit=*/100));
  std::vector<Boundary> edges;
  for (int i = 0; i < 4; ++i) edges.emplace_back(at::randn({2, 5}));  // 40 bytes each
  for (int i = 0; i < 4; ++i) store.put(edges[i], i ? &edges[i - 1] : nullptr);
  EXPECT_EQ(store.host_bytes(), 80);
  EXPECT_EQ(store.device_bytes(), 80);
  for (int i = 3; i >= 0; --i) {
    Boundary g = store.take(i);
    EXPECT_TRUE(at::equal(g.hidden, edges[i].hidden));
    EXPECT_EQ(g.hidden.data_ptr() == edges[i].hidden.data_ptr(), i >= 2) << i;
  }
}

TEST(BoundaryStore, MisuseIsAnError) {
  BoundaryStore store(store_opts(true));
  Boundary a = store_edge(1), b = store_edge(2), c(at::randn({2, 5}));
  store.put(a);
  EXPECT_THROW(store.put(c, &b), hearth::Error);  // b was never put
  store.take(0);
  EXPECT_THROW(store.take(0), hearth::Error);
  EXPECT_THROW(store.prefetch(0), hearth::Error);
  EXPECT_THROW(store.take(5), hearth::Error);
  BoundaryStoreOptions bad;
  bad.piece_bytes = 0;
  EXPECT_THROW(BoundaryStore{bad}, hearth::Error);
}
