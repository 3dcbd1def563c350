// safetensors: header validation, mmap-backed zero-copy reading, and atomic writing.
// Not a model loader (weights.cpp finds the files of a model folder).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_nesting.h"
#include "io/atomic_file.h"

namespace hearth::io {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct DTypeRow {
  DType dtype;
  const char* name;
  int64_t size;
  at::ScalarType scalar;
};

constexpr DTypeRow kDTypes[] = {
    {DType::F32, "F32", 4, at::kFloat},  {DType::F16, "F16", 2, at::kHalf},  {DType::BF16, "BF16", 2, at::kBFloat16},
    {DType::I8, "I8", 1, at::kChar},     {DType::U8, "U8", 1, at::kByte},    {DType::I16, "I16", 2, at::kShort},
    {DType::I32, "I32", 4, at::kInt},    {DType::U32, "U32", 4, at::kInt},   {DType::I64, "I64", 8, at::kLong},
    {DType::BOOL, "BOOL", 1, at::kBool}, {DType::F64, "F64", 8, at::kDouble},
};

const DTypeRow& row_of(DType d) {
  for (const auto& r : kDTypes)
    if (r.dtype == d) return r;
  throw Error("safetensors: internal error: unknown DType");
}

// A header string made safe for a one-line message: control bytes become \xNN, long ones are cut.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return s.size() > 200 ? out + "..." : out;
}

// A JSON value for a message: compact, at most ~200 characters.
std::string brief(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 200 ? s.substr(0, 200) + "..." : s;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A non-negative JSON integer, or nullopt (floats, negatives, other types).
std::optional<uint64_t> as_uint(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

TensorInfo parse_entry(const std::string& name, const json& e, uint64_t data_size, const std::string& origin) {
  const std::string where = cat(origin, ": tensor '", printable(name), "'");
  HEARTH_CHECK(e.is_object(), where, ": entry is not an object");
  TensorInfo t;
  t.name = name;

  auto it = e.find("dtype");
  HEARTH_CHECK(it != e.end(), where, ": missing 'dtype'");
  HEARTH_CHECK(it->is_string(), where, ": 'dtype' is not a string");
  auto dt = parse_dtype_name(it->get_ref<const std::string&>());
  HEARTH_CHECK(dt.has_value(), where, ": unknown dtype '", printable(it->get_ref<const std::string&>()), "'");
  t.dtype = *dt;

  it = e.find("shape");
  HEARTH_CHECK(it != e.end(), where, ": missing 'shape'");
  HEARTH_CHECK(it->is_array(), where, ": 'shape' is not an array");
  HEARTH_CHECK(it->size() <= 64, where, ": 'shape' has ", it->size(), " dimensions (at most 64)");
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : *it) {
    HEARTH_CHECK(d.is_number_integer(), where, ": shape ", brief(*it), " has a non-integer dimension");
    HEARTH_CHECK(d.is_number_unsigned() || d.get<int64_t>() >= 0, where, ": shape ", brief(*it),
                 " has a negative dimension");
    uint64_t v = *as_uint(d);
    HEARTH_CHECK(v <= static_cast<uint64_t>(INT64_MAX), where, ": shape ", brief(*it), " has a dimension too large");
    t.shape.push_back(static_cast<int64_t>(v));
    overflow = overflow || __builtin_mul_overflow(numel, v, &numel);
  }
  const uint64_t elem = static_cast<uint64_t>(row_of(t.dtype).size);
  uint64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, elem, &nbytes);

  it = e.find("data_offsets");
  HEARTH_CHECK(it != e.end(), where, ": missing 'data_offsets'");
  HEARTH_CHECK(it->is_array() && it->size() == 2, where, ": 'data_offsets' is not a [begin, end] pair");
  auto b = as_uint((*it)[0]);
  auto en = as_uint((*it)[1]);
  HEARTH_CHECK(b && en, where, ": data_offsets ", brief(*it), " are not non-negative integers");
  t.begin = *b;
  t.end = *en;
  HEARTH_CHECK(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] have begin > end");
  HEARTH_CHECK(t.end <= data_size, where, ": data_offsets [", t.begin, ", ", t.end, "] exceed data size ",
               data_size);
  HEARTH_CHECK(!overflow && nbytes == t.end - t.begin, where, ": ", dtype_name(t.dtype), " ", shape_str(t.shape),
               " needs ", overflow ? std::string("more than 2^64") : std::to_string(nbytes),
               " bytes but data_offsets [", t.begin, ", ", t.end, "] span ", t.end - t.begin);
  return t;
}

}  // namespace

const char* dtype_name(DType d) { return row_of(d).name; }
int64_t dtype_size(DType d) { return row_of(d).size; }
at::ScalarType to_scalar_type(DType d) { return row_of(d).scalar; }

DType from_scalar_type(at::ScalarType t) {
  for (const auto& r : kDTypes)
    if (r.scalar == t && r.dtype != DType::U32) return r.dtype;
  throw Error(cat("safetensors: cannot store tensors of type ", c10::toString(t)));
}

std::optional<DType> parse_dtype_name(std::string_view name) {
  for (const auto& r : kDTypes)
    if (name == r.name) return r.dtype;
  return std::nullopt;
}

std::vector<TensorInfo> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                 const std::string& origin,
                                                 std::map<std::string, std::string>* metadata) {
  check_json_nesting(header_json, origin + ": header");
  // The reference reader (safetensors crate) parses the header with serde_json: JSON whitespace
  // may pad it (the writers pad with spaces to a multiple of 8), NUL bytes or other trailing
  // bytes may not.
  HEARTH_CHECK(header_json.find('\0') == std::string_view::npos, origin,
               ": header contains NUL bytes (only spaces may pad a safetensors header)");
  json h = json::parse(header_json.begin(), header_json.end(), nullptr, /*allow_exceptions=*/false);
  HEARTH_CHECK(!h.is_discarded(), origin, ": header is not valid JSON");
  HEARTH_CHECK(h.is_object(), origin, ": header is not a JSON object (got ", h.type_name(), ")");
  std::vector<TensorInfo> out;
  out.reserve(h.size());
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      const json& m = it.value();
      HEARTH_CHECK(m.is_object() || m.is_null(), origin, ": __metadata__ is not an object of strings");
      if (m.is_null()) continue;
      for (auto mi = m.begin(); mi != m.end(); ++mi) {
        HEARTH_CHECK(mi.value().is_string(), origin, ": __metadata__ key '", printable(mi.key()), "' is not a string");
        if (metadata) (*metadata)[mi.key()] = mi.value().get<std::string>();
      }
      continue;
    }
    out.push_back(parse_entry(it.key(), it.value(), data_size, origin));
  }
  // The reference's Metadata::validate: sorted by data_offsets, the tensors tile the data section
  // from byte 0 with no gap or overlap, and the last one ends where the file ends (else
  // MetadataIncompleteBuffer).
  std::vector<const TensorInfo*> by_begin;
  for (const auto& t : out) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_begin) {
    HEARTH_CHECK(t->begin >= covered || !prev, origin, ": tensor '", printable(t->name), "': data_offsets [",
                 t->begin, ", ", t->end, "] overlap tensor '", printable(prev ? prev->name : ""), "' [",
                 prev ? prev->begin : 0, ", ", prev ? prev->end : 0, "]");
    HEARTH_CHECK(t->begin == covered, origin, ": tensor '", printable(t->name), "': data_offsets [", t->begin, ", ",
                 t->end, "] leave bytes [", covered, ", ", t->begin, ") of the data section unused");
    covered = t->end;
    prev = t;
  }
  HEARTH_CHECK(covered == data_size, origin, ": ", data_size - covered, " bytes after the last tensor (byte ",
               covered, " of a ", data_size, "-byte data section): the reference reader rejects this "
               "(MetadataIncompleteBuffer); truncated header or appended data?");
  return out;
}

std::vector<TensorInfo> parse_safetensors_bytes(std::string_view bytes, const std::string& origin,
                                                std::map<std::string, std::string>* metadata,
                                                uint64_t* data_offset) {
  HEARTH_CHECK(!bytes.empty(), origin, ": empty file (0 bytes), not a safetensors file");
  HEARTH_CHECK(bytes.size() >= 8, origin, ": file too short (", bytes.size(),
               " bytes) for the 8-byte safetensors header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  // The length's value is not quoted: the file may be anything (even another file behind a symlink).
  HEARTH_CHECK(n <= kMaxHeaderBytes, origin, ": header length exceeds the 100 MB limit (not a safetensors file?)");
  HEARTH_CHECK(n <= bytes.size() - 8, origin, ": header length exceeds the file size ", bytes.size(),
               " (truncated file, or not a safetensors file?)");
  if (data_offset) *data_offset = 8 + n;
  return parse_safetensors_header(bytes.substr(8, n), bytes.size() - 8 - n, origin, metadata);
}

// --- SafetensorsFile ----------------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path, const Roots& roots) {
  const std::string origin = path.string();
  OpenFile file(path, roots);  // regular file (no FIFO or device), inside `roots`
  const size_t size = static_cast<size_t>(file.size());
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    HEARTH_CHECK(map != MAP_FAILED, origin, ": cannot mmap (", std::strerror(errno), ")");
  }
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;
  f->self_ = f;
  // From here on the destructor unmaps on error.
  f->tensors_ = parse_safetensors_bytes(std::string_view(static_cast<const char*>(map), size), origin,
                                        &f->metadata_, &f->data_offset_);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

uint64_t SafetensorsFile::data_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.end - t.begin;
  return n;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) > 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  HEARTH_CHECK_T(NotFound, it != index_.end(), path_.string(), ": no tensor '", name, "'");
  return tensors_[it->second];
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& t = info(name);
  const at::ScalarType st = to_scalar_type(t.dtype);
  const int64_t elem = dtype_size(t.dtype);
  char* ptr = static_cast<char*>(map_) + data_offset_ + t.begin;
  const auto opts = at::TensorOptions().dtype(st).device(at::kCPU);
  if (t.end == t.begin) return at::empty(t.shape, opts);
  if (t.dtype == DType::BOOL) {
    // Bytes other than 0/1 are not valid torch bools: normalize through a byte view.
    at::Tensor bytes = at::from_blob(ptr, t.shape, at::TensorOptions().dtype(at::kByte));
    return bytes.ne(0);
  }
  if (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(elem) != 0) {
    // Misaligned for its element type (odd header length or offsets): copy into aligned memory.
    at::Tensor out = at::empty(t.shape, opts);
    std::memcpy(out.data_ptr(), ptr, t.end - t.begin);
    return out;
  }
  std::shared_ptr<const SafetensorsFile> keep = self_.lock();
  return at::from_blob(ptr, t.shape, [keep](void*) {}, opts);
}

// --- writing ------------------------------------------------------------------------------------

void save_safetensors(const fs::path& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const std::map<std::string, DType>& stored_dtypes) {
  std::vector<at::Tensor> data;
  data.reserve(tensors.size());
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t0] : tensors) {
    HEARTH_CHECK(name != "__metadata__", path.string(), ": '__metadata__' cannot name a tensor");
    at::Tensor t = t0.to(at::kCPU).contiguous();
    DType dt = from_scalar_type(t.scalar_type());
    if (auto s = stored_dtypes.find(name); s != stored_dtypes.end()) {
      HEARTH_CHECK(to_scalar_type(s->second) == t.scalar_type(), path.string(), ": tensor '", name, "' is ",
                   c10::toString(t.scalar_type()), ", cannot be stored as ", dtype_name(s->second));
      dt = s->second;
    }
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(t.element_size());
    header[name] = {{"dtype", dtype_name(dt)}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(std::move(t));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  write_file_atomic(path, [&](std::ostream& out) {
    uint64_t n = h.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out.write(len, 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& t : data)
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
  });
}

}  // namespace hearth::io
