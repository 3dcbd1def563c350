// Tests for io/weights: single file, indexed shards, glob fallback, and the folder-level errors
// (missing folder, no weights, missing shard, duplicate tensor, shape mismatch).
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/weights.h"
#include "io_test_util.h"

using hearth::io::WeightStore;
using hearth::testing::TempDir;

namespace {

void expect_error(const std::function<void()>& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const hearth::Error& e) {
    std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace

TEST(Weights, SingleFile) {
  TempDir d;
  hearth::io::save_safetensors(d / "model.safetensors", {{"w", at::ones({2, 3})}, {"b", at::zeros({3})}});
  WeightStore ws = WeightStore::open(d.path());
  EXPECT_EQ(ws.names(), (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(ws.total_bytes(), 9 * 4);
  EXPECT_FLOAT_EQ(ws.get("w").sum().item<float>(), 6.0f);
  EXPECT_NO_THROW(ws.get("w", {2, 3}));
  expect_error([&] { ws.get("w", {3, 2}); }, {"model.safetensors: tensor w has shape [2, 3], expected [3, 2]"});
  expect_error([&] { ws.get("nope"); }, {d.path().string(), "missing tensor nope"});
}

TEST(Weights, IndexedShards) {
  TempDir d;
  hearth::io::save_safetensors(d / "model-00001-of-00002.safetensors", {{"a", at::ones({2})}});
  hearth::io::save_safetensors(d / "model-00002-of-00002.safetensors", {{"b", at::full({2}, 2.0f)}});
  hearth::io::write_file_atomic(
      d / "model.safetensors.index.json",
      R"({"metadata":{"total_size":16},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  WeightStore ws = WeightStore::open(d.path());
  EXPECT_EQ(ws.files().size(), 2u);
  EXPECT_EQ(ws.file_of("b").filename(), "model-00002-of-00002.safetensors");
  EXPECT_FLOAT_EQ(ws.get("b")[1].item<float>(), 2.0f);
}

TEST(Weights, GlobWithoutIndex) {
  TempDir d;
  hearth::io::save_safetensors(d / "x.safetensors", {{"a", at::ones({1})}});
  hearth::io::save_safetensors(d / "y.safetensors", {{"b", at::ones({1})}});
  EXPECT_EQ(WeightStore::open(d.path()).names().size(), 2u);
}

TEST(WeightsErrors, MissingFolder) {
  TempDir d;
  expect_error([&] { WeightStore::open(d / "absent"); }, {"absent: model folder not found"});
}

TEST(WeightsErrors, NoWeights) {
  TempDir d;
  hearth::io::write_file_atomic(d / "config.json", "{}");
  expect_error([&] { WeightStore::open(d.path()); }, {d.path().string(), "no weights"});
}

TEST(WeightsErrors, IndexNamesMissingShard) {
  TempDir d;
  hearth::io::save_safetensors(d / "s1.safetensors", {{"a", at::ones({1})}});
  hearth::io::write_file_atomic(d / "model.safetensors.index.json",
                                R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  expect_error([&] { WeightStore::open(d.path()); },
               {"model.safetensors.index.json", "shard 's2.safetensors'", "missing"});
}

TEST(WeightsErrors, IndexTensorNotInShard) {
  TempDir d;
  hearth::io::save_safetensors(d / "s1.safetensors", {{"a", at::ones({1})}});
  hearth::io::write_file_atomic(d / "model.safetensors.index.json",
                                R"({"weight_map":{"a":"s1.safetensors","zz":"s1.safetensors"}})");
  expect_error([&] { WeightStore::open(d.path()); }, {"model.safetensors.index.json", "tensor 'zz'"});
}

TEST(WeightsErrors, IndexPathTraversalRejected) {
  TempDir d;
  hearth::io::write_file_atomic(d / "model.safetensors.index.json", R"({"weight_map":{"a":"../x.safetensors"}})");
  expect_error([&] { WeightStore::open(d.path()); }, {"is not a file name in the model folder"});
}

TEST(WeightsErrors, DuplicateTensorAcrossShards) {
  TempDir d;
  hearth::io::save_safetensors(d / "s1.safetensors", {{"a", at::ones({1})}});
  hearth::io::save_safetensors(d / "s2.safetensors", {{"a", at::ones({1})}});
  hearth::io::write_file_atomic(d / "model.safetensors.index.json",
                                R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  expect_error([&] { WeightStore::open(d.path()); },
               {d.path().string(), "tensor 'a' appears in both s1.safetensors and s2.safetensors"});
}

TEST(WeightsErrors, CorruptShardNamesTheShard) {
  TempDir d;
  hearth::testing::write_bytes(d / "model.safetensors", "");
  expect_error([&] { WeightStore::open(d.path()); }, {(d / "model.safetensors").string(), "empty file"});
}

TEST(WeightsErrors, IndexInvalidJson) {
  TempDir d;
  hearth::io::write_file_atomic(d / "model.safetensors.index.json", "{\"weight_map\": ");
  expect_error([&] { WeightStore::open(d.path()); }, {"model.safetensors.index.json: invalid JSON"});
}
