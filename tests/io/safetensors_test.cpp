// Tests for io/safetensors: reading hand-built files (the format spec, not our writer), round trips
// through our writer, zero-copy lifetime, misaligned data, and every corrupt-file error message.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io_test_util.h"

using hearth::io::SafetensorsFile;
using hearth::testing::safetensors_bytes;
using hearth::testing::TempDir;
using hearth::testing::write_bytes;

namespace {

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

// Expects opening `bytes` (written to a temp file) to throw hearth::Error whose message contains the
// file path and every one of `needles`.
void expect_open_error(const std::string& bytes, std::initializer_list<std::string> needles) {
  TempDir d;
  auto p = d / "bad.safetensors";
  write_bytes(p, bytes);
  try {
    SafetensorsFile::open(p);
    ADD_FAILURE() << "no error for " << bytes.substr(0, 200);
  } catch (const hearth::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

const std::string kGoodEntry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

}  // namespace

TEST(Safetensors, ReadsHandBuiltFile) {
  TempDir d;
  std::string header = R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)" +
                       kGoodEntry + "}";
  std::string data = f32_bytes({1.5f, -2.0f});
  int64_t seven = 7;
  data.append(reinterpret_cast<const char*>(&seven), 8);
  write_bytes(d / "m.safetensors", safetensors_bytes(header, data));
  auto f = SafetensorsFile::open(d / "m.safetensors");
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  at::Tensor a = f->tensor("a");
  EXPECT_EQ(a.scalar_type(), at::kFloat);
  EXPECT_EQ(a.sizes().vec(), std::vector<int64_t>{2});
  EXPECT_FLOAT_EQ(a[0].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(a[1].item<float>(), -2.0f);
  EXPECT_EQ(f->tensor("b").item<int64_t>(), 7);
  EXPECT_TRUE(f->contains("a"));
  EXPECT_FALSE(f->contains("c"));
  EXPECT_THROW(f->tensor("c"), hearth::NotFound);
}

TEST(Safetensors, ViewsAreZeroCopyAndOutliveTheFileHandle) {
  TempDir d;
  std::string header = "{" + kGoodEntry + "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // aligned data: no copy
  write_bytes(d / "m.safetensors", safetensors_bytes(header, f32_bytes({3.0f, 4.0f})));
  auto f = SafetensorsFile::open(d / "m.safetensors");
  at::Tensor a1 = f->tensor("a");
  at::Tensor a2 = f->tensor("a");
  EXPECT_EQ(a1.data_ptr(), a2.data_ptr());  // both views of the one mapping
  f.reset();
  EXPECT_FLOAT_EQ(a1.sum().item<float>(), 7.0f);  // mapping still alive through the view
}

TEST(Safetensors, MisalignedDataIsCopiedCorrectly) {
  TempDir d;
  std::string header = "{" + kGoodEntry + "}";
  header += std::string((header.size() % 2 == 0) ? 1 : 0, ' ');  // odd length: data at an odd offset
  write_bytes(d / "m.safetensors", safetensors_bytes(header, f32_bytes({5.0f, 6.0f})));
  auto f = SafetensorsFile::open(d / "m.safetensors");
  at::Tensor a = f->tensor("a");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 4, 0u);
  EXPECT_FLOAT_EQ(a[0].item<float>(), 5.0f);
  EXPECT_FLOAT_EQ(a[1].item<float>(), 6.0f);
}

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir d;
  std::map<std::string, at::Tensor> t;
  t["f32"] = at::randn({3, 4});
  t["bf16"] = at::randn({5}).to(at::kBFloat16);
  t["f16"] = at::randn({2, 2}).to(at::kHalf);
  t["f64"] = at::randn({2}, at::kDouble);
  t["i64"] = at::arange(6, at::kLong).view({2, 3});
  t["i32"] = at::arange(4, at::kInt);
  t["u32"] = at::tensor({-1, 0, 1, 2}, at::kInt);
  t["i16"] = at::arange(3, at::kShort);
  t["i8"] = at::arange(-2, 2, at::kChar);
  t["u8"] = at::arange(250, 256, at::kLong).to(at::kByte);
  t["bool"] = at::tensor({1, 0, 1}, at::kLong).to(at::kBool);
  t["empty"] = at::empty({0, 3});
  t["scalar"] = at::full({}, 2.5f);
  auto p = d / "rt.safetensors";
  hearth::io::save_safetensors(p, t, {{"format", "mlx"}}, {{"u32", hearth::io::DType::U32}});
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->metadata().at("format"), "mlx");
  EXPECT_EQ(f->info("u32").dtype, hearth::io::DType::U32);
  EXPECT_EQ(f->info("i32").dtype, hearth::io::DType::I32);
  for (const auto& [name, v] : t) {
    at::Tensor r = f->tensor(name);
    EXPECT_EQ(r.scalar_type(), v.scalar_type()) << name;
    EXPECT_EQ(r.sizes(), v.sizes()) << name;
    EXPECT_TRUE(at::equal(r, v)) << name;
  }
  // Header length is a multiple of 8 and padded with spaces, like the Python writer.
  std::string bytes = hearth::io::read_file(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));
  // Names sorted in the header and data laid out in that order.
  EXPECT_LT(header.find("\"bf16\""), header.find("\"f32\""));
  EXPECT_EQ(f->info("bf16").begin, 0u);
  EXPECT_FALSE(std::filesystem::exists(p.string() + ".tmp." + std::to_string(::getpid())));
}

TEST(Safetensors, SaveRejectsWrongStoredDtype) {
  TempDir d;
  EXPECT_THROW(hearth::io::save_safetensors(d / "x.safetensors", {{"a", at::zeros({2})}}, {},
                                            {{"a", hearth::io::DType::U32}}),
               hearth::Error);
  EXPECT_FALSE(std::filesystem::exists(d / "x.safetensors"));
}

TEST(SafetensorsErrors, MissingFile) {
  TempDir d;
  try {
    SafetensorsFile::open(d / "nope.safetensors");
    FAIL();
  } catch (const hearth::NotFound& e) {
    EXPECT_NE(std::string(e.what()).find("nope.safetensors: cannot open (no such file)"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsErrors, EmptyFile) { expect_open_error("", {"empty file"}); }

TEST(SafetensorsErrors, ShorterThanLengthPrefix) { expect_open_error("abc", {"too short (3 bytes)"}); }

TEST(SafetensorsErrors, HeaderLengthBeyondFile) {
  expect_open_error(safetensors_bytes("{}", "", 4096), {"header length exceeds the file size 10"});
}

// The first 8 bytes of any file are read as the header length: their value must not be echoed
// (a symlink to /etc/passwd would print its first bytes as a number).
TEST(SafetensorsErrors, HeaderLengthIsNotQuoted) {
  const std::string text = "root:x:0:0:root:/root:/bin/bash\n";
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(text[i]);
  TempDir d;
  write_bytes(d / "passwd.safetensors", text);
  try {
    SafetensorsFile::open(d / "passwd.safetensors");
    FAIL();
  } catch (const hearth::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("header length exceeds the 100 MB limit"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(std::to_string(n)), std::string::npos) << msg;
    EXPECT_EQ(msg.find("root:"), std::string::npos) << msg;
  }
}

// The reference reader (safetensors crate, Metadata::validate + read_metadata) rejects bytes after
// the last tensor and gaps between tensors (MetadataIncompleteBuffer / InvalidOffset).
TEST(SafetensorsErrors, TrailingBytesAfterLastTensor) {
  expect_open_error(safetensors_bytes("{" + kGoodEntry + "}", f32_bytes({1, 2}) + "abcd"),
                    {"4 bytes after the last tensor", "MetadataIncompleteBuffer"});
  // A header with no tensors and a data section.
  expect_open_error(safetensors_bytes("{}", "abcd"), {"4 bytes after the last tensor"});
}

TEST(SafetensorsErrors, GapsBetweenTensors) {
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                      f32_bytes({1, 2, 3})),
                    {"tensor 'b'", "leave bytes [4, 8) of the data section unused"});
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32_bytes({1, 2})),
                    {"tensor 'a'", "leave bytes [0, 4)"});
}

TEST(SafetensorsErrors, HeaderPaddedWithNulBytes) {
  expect_open_error(safetensors_bytes("{" + kGoodEntry + "}" + std::string(3, '\0'), f32_bytes({1, 2})),
                    {"NUL"});
}

TEST(Safetensors, HeaderPaddedWithSpacesAndZeroSizeTensorsAreAccepted) {
  TempDir d;
  write_bytes(d / "ok.safetensors",
              safetensors_bytes(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)" + kGoodEntry + "}     ",
                                f32_bytes({1, 2})));
  auto f = SafetensorsFile::open(d / "ok.safetensors");
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensor("a")[1].item<float>(), 2.0f);
}

TEST(SafetensorsErrors, HeaderLengthAbsurd) {
  expect_open_error(safetensors_bytes("{}", "", 1LL << 40), {"exceeds the 100 MB limit"});
}

TEST(SafetensorsErrors, TruncatedFile) {
  std::string full = safetensors_bytes("{" + kGoodEntry + "}", f32_bytes({1, 2}));
  expect_open_error(full.substr(0, full.size() - 3), {"tensor 'a'", "data_offsets [0, 8] exceed data size 5"});
}

TEST(SafetensorsErrors, InvalidJson) { expect_open_error(safetensors_bytes("{\"a\":", ""), {"not valid JSON"}); }

TEST(SafetensorsErrors, HeaderNotAnObject) {
  expect_open_error(safetensors_bytes("[1,2]", ""), {"not a JSON object (got array)"});
}

TEST(SafetensorsErrors, UnknownDtype) {
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", "xx"),
                    {"tensor 'a'", "unknown dtype 'F8_E9'"});
}

TEST(SafetensorsErrors, NegativeShape) {
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "xx"),
                    {"tensor 'a'", "negative dimension"});
}

TEST(SafetensorsErrors, MissingFields) {
  expect_open_error(safetensors_bytes(R"({"a":{"shape":[2],"data_offsets":[0,2]}})", "xx"), {"missing 'dtype'"});
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"U8","data_offsets":[0,2]}})", "xx"), {"missing 'shape'"});
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"U8","shape":[2]}})", "xx"), {"missing 'data_offsets'"});
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "xx"),
                    {"not a [begin, end] pair"});
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", "xx"),
                    {"non-integer dimension"});
}

TEST(SafetensorsErrors, OffsetsOutOfBounds) {
  expect_open_error(safetensors_bytes(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32_bytes({1})),
                    {"tensor 'x': data_offsets [0, 16] exceed data size 4"});
  expect_open_error(safetensors_bytes(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", f32_bytes({1})),
                    {"begin > end"});
}

TEST(SafetensorsErrors, OverlappingOffsets) {
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                      f32_bytes({1, 2, 3})),
                    {"tensor 'b'", "overlap tensor 'a'"});
}

TEST(SafetensorsErrors, DtypeTimesShapeMismatch) {
  expect_open_error(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32_bytes({1, 2})),
                    {"tensor 'a'", "needs 12 bytes", "span 8"});
}

TEST(SafetensorsErrors, ShapeProductOverflow) {
  expect_open_error(
      safetensors_bytes(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", "12345678"),
      {"tensor 'a'", "more than 2^64"});
}

TEST(SafetensorsErrors, MetadataNotStrings) {
  expect_open_error(safetensors_bytes(R"({"__metadata__":{"n":1}})", ""), {"__metadata__ key 'n' is not a string"});
}

TEST(SafetensorsErrors, ControlCharactersInNamesStayOnOneLine) {
  // expect_open_error also checks that the message has no newline.
  expect_open_error(safetensors_bytes(R"({"a\nb":{"dtype":"X","shape":[],"data_offsets":[0,0]}})", ""),
                    {"tensor 'a\\x0ab'", "unknown dtype 'X'"});
}

TEST(SafetensorsErrors, ParseHeaderDirectly) {
  EXPECT_THROW(hearth::io::parse_safetensors_header("{\"a\":3}", 0, "h"), hearth::Error);
  auto v = hearth::io::parse_safetensors_header("{" + kGoodEntry + "}", 8, "h");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].end, 8u);
}
