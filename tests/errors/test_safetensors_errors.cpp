// Bad safetensors inputs: every malformed file fails to open with a message naming the file, the tensor and
// the problem; bad arguments to the writer fail before anything is written.
#include <gtest/gtest.h>

#include <filesystem>

#include "runtime/file_util.h"
#include "runtime/safetensors.h"

namespace ingot {
namespace {

::testing::AssertionResult contains(const std::string& message, const std::string& part) {
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected the message to contain\n  " << part << "\nbut it was\n  "
                                       << message;
}

// Writes an 8-byte length (the header's size unless given), the header text, then `data_bytes` bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes, int64_t length = -1) {
  write_file_atomic(path, [&](std::FILE* f) {
    uint64_t n = length >= 0 ? static_cast<uint64_t>(length) : header.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    write_bytes(f, len, 8);
    write_bytes(f, header.data(), header.size());
    std::string data(data_bytes, '\x01');
    write_bytes(f, data.data(), data.size());
  });
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "opening " << path << " did not throw";
  return "";
}

struct BadHeader {
  const char* test_name;
  const char* header;
  size_t data_bytes;
  std::vector<const char*> expected;  // substrings of the message (the file path is always checked)
};

class SafetensorsBadHeader : public ::testing::TestWithParam<BadHeader> {};

TEST_P(SafetensorsBadHeader, FailsToOpenWithAMessageNamingTheProblem) {
  const BadHeader& c = GetParam();
  TempDir dir("ingot_st_err_");
  std::string path = dir.file("bad.safetensors");
  write_raw(path, c.header, c.data_bytes);
  std::string msg = open_error(path);
  EXPECT_TRUE(contains(msg, path));
  for (const char* s : c.expected) EXPECT_TRUE(contains(msg, s));
}

// A valid entry to embed: 2 x F32 = 8 bytes.
#define OK_W R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"

INSTANTIATE_TEST_SUITE_P(
    Errors, SafetensorsBadHeader,
    ::testing::Values(
        BadHeader{"HeaderIsNotJson", R"({"w": {"dtype": "F32",)", 0, {"header is not valid JSON"}},
        BadHeader{"HeaderIsEmpty", "", 0, {"header is not valid JSON"}},
        BadHeader{"HeaderIsNotAnObject", "[1, 2]", 0, {"header must be a JSON object", "array"}},
        BadHeader{"EntryIsNotAnObject", R"({"w": 5})", 0, {"tensor 'w'", "expected an object", "number"}},
        BadHeader{"DTypeIsMissing", R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "missing 'dtype'"}},
        BadHeader{"ShapeIsMissing", R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "missing 'shape'"}},
        BadHeader{"DataOffsetsAreMissing", R"({"w":{"dtype":"F32","shape":[2]}})", 8,
                  {"tensor 'w'", "missing 'data_offsets'"}},
        BadHeader{"DTypeIsNotAString", R"({"w":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "'dtype' must be a string", "number"}},
        BadHeader{"DTypeIsUnknown", R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2,
                  {"tensor 'w'", "unsupported dtype 'F8_E4M3'", "BF16"}},
        BadHeader{"ShapeIsNotAnArray", R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "'shape' must be an array", "string"}},
        BadHeader{"ShapeHasANegativeDim", R"({"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "shape dimension 1 is -3", "non-negative"}},
        BadHeader{"ShapeHasAFractionalDim", R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "shape dimension 0 is not an integer", "2.5"}},
        BadHeader{"ShapeHasAStringDim", R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "shape dimension 0 is not an integer"}},
        BadHeader{"ShapeDimExceedsInt64",
                  R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "expected a non-negative 64-bit integer"}},
        BadHeader{"ShapeProductOverflows",
                  R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "more elements than fit in 64 bits"}},
        BadHeader{"ByteSizeOverflows",
                  R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8,
                  {"tensor 'w'", "needs more than 2^64 bytes"}},
        BadHeader{"DataOffsetsAreNotAPair", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", 8,
                  {"tensor 'w'", "'data_offsets' must be two non-negative integers", "[0,4,8]"}},
        BadHeader{"DataOffsetsAreNegative", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8,
                  {"tensor 'w'", "'data_offsets' must be two non-negative integers"}},
        BadHeader{"DataOffsetsBeginAfterEnd", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8,
                  {"tensor 'w'", "begin > end"}},
        BadHeader{"DataOffsetsSpanTheWrongSize", R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                  20, {"tensor 'w'", "span 20 bytes", "needs 24"}},
        BadHeader{"FirstTensorDoesNotStartAtZero", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12, {"tensor 'w'", "starts at byte 4", "expected 0"}},
        BadHeader{"TensorsOverlap",
                  "{" OK_W R"(,"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
                  {"tensors 'w'", "and 'v'", "overlap"}},
        BadHeader{"TensorsLeaveAGap",
                  "{" OK_W R"(,"v":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16,
                  {"gap of 4 bytes", "'w'", "'v'"}},
        BadHeader{"DataBufferIsTruncated", "{" OK_W "}", 6, {"tensor 'w' ends at byte 8", "only 6 bytes"}},
        BadHeader{"DataBufferHasTrailingBytes", "{" OK_W "}", 10, {"has 10 bytes", "cover only 8", "2 trailing"}},
        BadHeader{"DataBufferWithoutTensors", R"({"__metadata__":{}})", 3, {"3 trailing bytes"}},
        BadHeader{"MetadataIsNotAnObject", "{" OK_W R"(,"__metadata__":["a"]})", 8,
                  {"'__metadata__' must be an object", "array"}},
        BadHeader{"MetadataValueIsNotAString", "{" OK_W R"(,"__metadata__":{"step":100}})", 8,
                  {"'__metadata__' value of 'step' must be a string", "100"}},
        BadHeader{"TensorNameIsDuplicated",
                  "{" OK_W R"(,"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16,
                  {"duplicate tensor name 'w'"}},
        BadHeader{"EntryKeyIsDuplicated", R"({"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})",
                  8, {"key 'dtype' appears twice", "'w'"}}),
    [](const ::testing::TestParamInfo<BadHeader>& info) { return std::string(info.param.test_name); });

TEST(SafetensorsErrors, FileShorterThanTheLengthFieldIsRejected) {
  TempDir dir("ingot_st_err_");
  std::string path = dir.file("short.safetensors");
  write_file_atomic(path, [](std::FILE* f) { write_bytes(f, "\x10\0\0", 3); });
  std::string msg = open_error(path);
  EXPECT_TRUE(contains(msg, path));
  EXPECT_TRUE(contains(msg, "file is 3 bytes, shorter than the 8-byte header length"));
}

TEST(SafetensorsErrors, HeaderLengthBeyondTheFileIsRejected) {
  TempDir dir("ingot_st_err_");
  std::string path = dir.file("long.safetensors");
  write_raw(path, "{" OK_W "}", 8, 4096);
  EXPECT_TRUE(contains(open_error(path), "header length 4096 is larger than the"));
}

TEST(SafetensorsErrors, HeaderLengthOverOneHundredMegabytesIsRejected) {
  TempDir dir("ingot_st_err_");
  std::string path = dir.file("huge.safetensors");
  write_raw(path, "{}", 0, 200'000'000);
  EXPECT_TRUE(contains(open_error(path), "header length 200000000 exceeds the limit of 100000000 bytes"));
}

TEST(SafetensorsErrors, MissingFilesAndDirectoriesAreRejected) {
  TempDir dir("ingot_st_err_");
  std::string missing = dir.file("nope.safetensors");
  EXPECT_TRUE(contains(open_error(missing), "'" + missing + "': cannot open: No such file or directory"));
  EXPECT_TRUE(contains(open_error(dir.path()), "not a regular file"));
}

// Every truncation and many single-byte corruptions of a valid file either still validate (then every tensor
// must be readable) or fail with an ingot::Error; nothing crashes or reads out of bounds.
TEST(SafetensorsErrors, TruncatedAndCorruptedFilesFailCleanly) {
  TempDir dir("ingot_st_err_");
  std::string good = dir.file("good.safetensors");
  save_safetensors(good,
                   {{"w", ones({3, 2}, DType::f32)}, {"b", zeros({5}, DType::bf16)}, {"m", ones({1}, DType::b8)}},
                   {{"k", "v"}});
  const std::string bytes = read_file(good);
  std::string path = dir.file("bad.safetensors");
  auto try_open = [&](const std::string& content) {
    std::FILE* out = std::fopen(path.c_str(), "wb");  // not write_file_atomic: its fsyncs would dominate
    std::fwrite(content.data(), 1, content.size(), out);
    std::fclose(out);
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      for (const std::string& name : f.names()) f.get(name).to_vector();
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  ASSERT_TRUE(try_open(bytes));
  for (size_t len = 0; len < bytes.size(); ++len) EXPECT_FALSE(try_open(bytes.substr(0, len))) << "length " << len;
  uint64_t header_end = 8 + static_cast<unsigned char>(bytes[0]);
  for (size_t pos = 0; pos < header_end; pos += 5) {
    for (unsigned char v : {'9', '"', '}', ',', '-', '\xff'}) {
      std::string corrupt = bytes;
      corrupt[pos] = static_cast<char>(v);
      try_open(corrupt);
    }
  }
}

TEST(SafetensorsErrors, AskingForAnAbsentTensorListsWhatTheFileHas) {
  TempDir dir("ingot_st_err_");
  std::string path = dir.file("ok.safetensors");
  save_safetensors(path, {{"alpha", ones({1})}, {"beta", ones({1})}});
  SafetensorsFile f = SafetensorsFile::open(path);
  try {
    f.get("gamma");
    ADD_FAILURE() << "get of an absent tensor did not throw";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "no tensor named 'gamma'"));
    EXPECT_TRUE(contains(e.what(), "2 tensors: alpha, beta"));
  }
}

TEST(SafetensorsErrors, BadWriterArgumentsFailBeforeTouchingTheFile) {
  TempDir dir("ingot_st_err_");
  std::string path = dir.file("w.safetensors");
  auto save_error = [&](const std::vector<std::pair<std::string, Tensor>>& ts,
                        const std::map<std::string, std::string>& meta = {}) -> std::string {
    try {
      save_safetensors(path, ts, meta);
    } catch (const Error& e) {
      return e.what();
    }
    return "did not throw";
  };
  EXPECT_TRUE(contains(save_error({{"a", ones({1})}, {"a", ones({2})}}), "duplicate tensor name 'a'"));
  EXPECT_TRUE(contains(save_error({{"", ones({1})}}), "tensor names must be non-empty"));
  EXPECT_TRUE(contains(save_error({{"__metadata__", ones({1})}}), "'__metadata__' is reserved"));
  EXPECT_TRUE(contains(save_error({{"u", Tensor()}}), "tensor 'u' is undefined"));
  EXPECT_TRUE(contains(save_error({{"bad\xff", ones({1})}}), "valid UTF-8"));
  EXPECT_TRUE(contains(save_error({{"w", ones({1})}}, {{"k", "\xc3"}}), "valid UTF-8"));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 0);
}

TEST(SafetensorsErrors, SavingIntoAMissingDirectoryNamesThePathAndReason) {
  TempDir dir("ingot_st_err_");
  std::string path = dir.file("no/such/dir/w.safetensors");
  try {
    save_safetensors(path, {{"w", ones({1})}});
    ADD_FAILURE() << "save into a missing directory did not throw";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "cannot write '" + path + "'"));
    EXPECT_TRUE(contains(e.what(), "No such file or directory"));
  }
}

}  // namespace
}  // namespace ingot
