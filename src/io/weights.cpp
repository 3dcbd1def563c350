// A model folder's safetensors files as one name -> tensor store (single file, indexed shards, or a
// glob). Not a loader for any family: names are returned verbatim.
#include "io/weights.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "io/hf_config.h"

namespace hearth::io {
namespace fs = std::filesystem;

namespace {

std::string shape_str(c10::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Shard file names from an index's weight_map (sorted, unique), checked to be plain names.
std::vector<std::string> shards_from_index(const fs::path& index_path, const nlohmann::json& index,
                                           std::map<std::string, std::string>* mapping) {
  const std::string origin = index_path.string();
  HEARTH_CHECK(index.is_object(), origin, ": not a JSON object");
  auto wm = index.find("weight_map");
  HEARTH_CHECK(wm != index.end(), origin, ": missing 'weight_map'");
  HEARTH_CHECK(wm->is_object(), origin, ": 'weight_map' is not an object");
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    HEARTH_CHECK(it.value().is_string(), origin, ": weight_map['", it.key(), "'] is not a file name");
    const std::string& file = it.value().get_ref<const std::string&>();
    HEARTH_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..", origin,
                 ": weight_map['", it.key(), "'] = '", file, "' is not a file name in the model folder");
    shards.insert(file);
    (*mapping)[it.key()] = file;
  }
  HEARTH_CHECK(!shards.empty(), origin, ": 'weight_map' is empty");
  return {shards.begin(), shards.end()};
}

}  // namespace

WeightStore WeightStore::open(const fs::path& dir) {
  std::error_code ec;
  HEARTH_CHECK_T(NotFound, fs::exists(dir, ec), dir.string(), ": model folder not found");
  HEARTH_CHECK(fs::is_directory(dir, ec), dir.string(), ": not a folder (expected a model folder)");
  WeightStore ws;
  ws.dir_ = dir;

  std::vector<fs::path> paths;
  std::map<std::string, std::string> mapping;  // from the index, when used
  fs::path index_path = dir / "model.safetensors.index.json";
  if (entry_exists(dir / "model.safetensors")) {
    paths.push_back(dir / "model.safetensors");
  } else if (entry_exists(index_path)) {
    for (const auto& shard : shards_from_index(index_path, read_json(index_path), &mapping)) {
      fs::path p = dir / shard;
      HEARTH_CHECK_T(NotFound, entry_exists(p), index_path.string(), ": shard '", shard,
                     "' named in weight_map is missing from ", dir.string());
      paths.push_back(p);
    }
  } else {
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".safetensors" && !fs::is_directory(entry.path(), ec))
        paths.push_back(entry.path());
    std::sort(paths.begin(), paths.end());
  }
  HEARTH_CHECK_T(NotFound, !paths.empty(), dir.string(),
                 ": no weights (expected model.safetensors, model.safetensors.index.json or *.safetensors)");

  for (const auto& p : paths) {
    auto f = SafetensorsFile::open(p);
    const size_t fi = ws.files_.size();
    for (const auto& t : f->tensors()) {
      auto [it, inserted] = ws.where_.emplace(t.name, fi);
      HEARTH_CHECK(inserted, dir.string(), ": tensor '", t.name, "' appears in both ",
                   ws.files_[it->second]->path().filename().string(), " and ", p.filename().string());
    }
    ws.files_.push_back(std::move(f));
  }
  for (const auto& [name, shard] : mapping) {
    auto it = ws.where_.find(name);
    HEARTH_CHECK(it != ws.where_.end(), index_path.string(), ": tensor '", name, "' mapped to ", shard,
                 " is not in that file");
    HEARTH_CHECK(ws.files_[it->second]->path().filename() == shard, index_path.string(), ": tensor '", name,
                 "' mapped to ", shard, " is in ", ws.files_[it->second]->path().filename().string());
  }
  return ws;
}

bool WeightStore::contains(const std::string& name) const { return where_.count(name) > 0; }

const TensorInfo& WeightStore::info(const std::string& name) const {
  auto it = where_.find(name);
  HEARTH_CHECK_T(NotFound, it != where_.end(), dir_.string(), ": missing tensor ", name);
  return files_[it->second]->info(name);
}

at::Tensor WeightStore::get(const std::string& name) const {
  auto it = where_.find(name);
  HEARTH_CHECK_T(NotFound, it != where_.end(), dir_.string(), ": missing tensor ", name);
  return files_[it->second]->tensor(name);
}

at::Tensor WeightStore::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  at::Tensor t = get(name);
  HEARTH_CHECK(t.sizes().vec() == expected_shape, file_of(name).string(), ": tensor ", name, " has shape ",
               shape_str(t.sizes()), ", expected ", shape_str(expected_shape));
  return t;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, _] : where_) out.push_back(name);
  return out;
}

int64_t WeightStore::total_bytes() const {
  int64_t n = 0;
  for (const auto& f : files_) n += static_cast<int64_t>(f->data_bytes());
  return n;
}

const fs::path& WeightStore::file_of(const std::string& name) const {
  auto it = where_.find(name);
  HEARTH_CHECK_T(NotFound, it != where_.end(), dir_.string(), ": missing tensor ", name);
  return files_[it->second]->path();
}

}  // namespace hearth::io
