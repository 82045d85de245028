// safetensors round trips and layout. Bad files and their messages: tests/errors/test_safetensors_errors.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "runtime/file_util.h"
#include "runtime/rng.h"
#include "runtime/safetensors.h"

namespace ingot {
namespace {

// The logical elements of t as raw bytes, for bit-exact comparisons (NaN payloads, -0.0).
std::string bytes_of(const Tensor& t) {
  Tensor c = t.to(Device::cpu()).contiguous_raw();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// Random values of every dtype, floats including -0, +-inf and NaN.
Tensor sample(DType dt, const Shape& shape) {
  if (dt == DType::b8) return randint(0, 2, shape).to(DType::b8);
  if (is_integral(dt)) return randint(-100000, 100000, shape).to(dt);
  Tensor t = randn(shape, DType::f64).to(dt);
  if (t.numel() >= 4) {
    Tensor flat = t.as_strided({t.numel()}, {1}, 0);
    flat.as_strided({1}, {1}, 0).fill_(-0.0);
    flat.as_strided({1}, {1}, 1).fill_(INFINITY);
    flat.as_strided({1}, {1}, 2).fill_(-INFINITY);
    flat.as_strided({1}, {1}, 3).fill_(NAN);
  }
  return t;
}

TEST(Safetensors, EveryDTypeRoundTripsBitExactly) {
  manual_seed(11);
  TempDir dir("ingot_st_");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType dt : kAllDTypes) tensors.emplace_back(std::string(dtype_name(dt)), sample(dt, {3, 5}));
  save_safetensors(dir.file("all.safetensors"), tensors);

  SafetensorsFile f = SafetensorsFile::open(dir.file("all.safetensors"));
  ASSERT_EQ(f.names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(f.has(name)) << name;
    Tensor back = f.get(name);
    EXPECT_EQ(back.dtype(), t.dtype()) << name;
    EXPECT_EQ(back.shape(), t.shape()) << name;
    EXPECT_TRUE(back.device().is_cpu());
    EXPECT_EQ(bytes_of(back), bytes_of(t)) << name;
    EXPECT_EQ(f.info(name).end - f.info(name).begin, t.nbytes()) << name;
  }
  EXPECT_TRUE(f.metadata().empty());
}

TEST(Safetensors, NonContiguousAndBroadcastInputsAreSavedInLogicalOrder) {
  manual_seed(12);
  TempDir dir("ingot_st_");
  Tensor base = randn({4, 6}, DType::f32);
  Tensor transposed = base.as_strided({6, 4}, {1, 6}, 0);
  Tensor sliced = base.as_strided({2, 3}, {6, 2}, 7);       // every other column of rows 1..2, offset view
  Tensor expanded = randn({3}, DType::bf16).expand_raw({2, 3});  // stride 0
  ASSERT_FALSE(transposed.is_contiguous());
  ASSERT_FALSE(sliced.is_contiguous());
  save_safetensors(dir.file("views.safetensors"), {{"t", transposed}, {"s", sliced}, {"e", expanded}});

  SafetensorsFile f = SafetensorsFile::open(dir.file("views.safetensors"));
  for (auto [name, src] : {std::pair{"t", transposed}, std::pair{"s", sliced}, std::pair{"e", expanded}}) {
    Tensor back = f.get(name);
    EXPECT_TRUE(back.is_contiguous());
    EXPECT_EQ(back.shape(), src.shape()) << name;
    EXPECT_EQ(back.to_vector(), src.to_vector()) << name;
  }
}

TEST(Safetensors, ScalarsEmptyTensorsAndAnEmptyFileRoundTrip) {
  TempDir dir("ingot_st_");
  Tensor scalar = full({}, 2.5, DType::f64);
  Tensor empty_rows = zeros({0, 3}, DType::f32);
  save_safetensors(dir.file("s.safetensors"), {{"scalar", scalar}, {"empty", empty_rows}});
  SafetensorsFile f = SafetensorsFile::open(dir.file("s.safetensors"));
  EXPECT_EQ(f.get("scalar").shape(), Shape{});
  EXPECT_EQ(f.get("scalar").item(), 2.5);
  EXPECT_EQ(f.get("empty").shape(), (Shape{0, 3}));
  EXPECT_EQ(f.get("empty").numel(), 0);

  save_safetensors(dir.file("none.safetensors"), {}, {{"note", "no tensors"}});
  SafetensorsFile g = SafetensorsFile::open(dir.file("none.safetensors"));
  EXPECT_TRUE(g.names().empty());
  EXPECT_EQ(g.metadata().at("note"), "no tensors");
}

TEST(Safetensors, MetadataRoundTrips) {
  TempDir dir("ingot_st_");
  std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "1200"}, {"quote\"and\\slash", "ünïcode"}};
  save_safetensors(dir.file("m.safetensors"), {{"w", ones({2}, DType::f32)}}, meta);
  EXPECT_EQ(SafetensorsFile::open(dir.file("m.safetensors")).metadata(), meta);
}

TEST(Safetensors, HeaderFollowsTheSpecAndIsPaddedToEightBytes) {
  TempDir dir("ingot_st_");
  std::string path = dir.file("h.safetensors");
  save_safetensors(path, {{"a", arange(0, 3, DType::f32)}, {"bb", ones({2, 2}, DType::i64)}}, {{"k", "v"}});
  std::string raw = read_file(path);
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + 12 + 32);
  auto header = nlohmann::json::parse(raw.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  EXPECT_EQ(header["bb"]["dtype"], "I64");
  EXPECT_EQ(header["bb"]["shape"], nlohmann::json::parse("[2, 2]"));
  // Wider types come first so every tensor is aligned to its itemsize.
  EXPECT_EQ(header["bb"]["data_offsets"], nlohmann::json::parse("[0, 32]"));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::parse("[32, 44]"));
  float a1;
  std::memcpy(&a1, raw.data() + 8 + n + 32 + 4, 4);
  EXPECT_EQ(a1, 1.0f);
}

TEST(Safetensors, MixedDTypesAreLaidOutAlignedAndLoadedWithoutCopies) {
  TempDir dir("ingot_st_");
  std::string path = dir.file("mixed.safetensors");
  // Odd element counts: in the given order, the f32 and f64 tensors would land misaligned.
  save_safetensors(path, {{"flag", ones({3}, DType::b8)},
                          {"half", ones({3}, DType::f16)},
                          {"w", ones({3}, DType::f32)},
                          {"d", ones({1}, DType::f64)}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"d", "w", "half", "flag"}));
  for (const std::string& name : f.names()) {
    Tensor t = f.get(name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % itemsize(t.dtype()), 0u) << name;
    EXPECT_EQ(t.data_ptr(), f.get(name).data_ptr()) << name << " should alias the mapping";
    EXPECT_EQ(t.to_vector(), std::vector<double>(static_cast<size_t>(t.numel()), 1.0)) << name;
  }
}

// A file written by hand as another writer might: unpadded header, keys not in data order, and an F32
// tensor that starts at an odd offset (so it must be copied to be aligned).
TEST(Safetensors, ReadsForeignFilesWithMisalignedTensors) {
  TempDir dir("ingot_st_");
  std::string path = dir.file("foreign.safetensors");
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[1,9]},)"
                       R"("flag":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})";
  float w[2] = {1.5f, -2.0f};
  write_file_atomic(path, [&](std::FILE* fp) {
    uint64_t n = header.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    write_bytes(fp, len, 8);
    write_bytes(fp, header.data(), n);
    unsigned char flag = 1;
    write_bytes(fp, &flag, 1);
    write_bytes(fp, w, sizeof(w));
  });
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"flag", "w"}));
  EXPECT_EQ(f.get("w").to_vector(), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(f.get("flag").to_vector(), (std::vector<double>{1.0}));
  EXPECT_EQ(f.info("w").dtype, DType::f32);
  EXPECT_EQ(f.info("w").begin, 1u);
  EXPECT_EQ(f.info("w").end, 9u);
}

TEST(Safetensors, LoadedTensorsOutliveTheFileObjectAndWritesNeverReachTheFile) {
  TempDir dir("ingot_st_");
  std::string path = dir.file("cow.safetensors");
  save_safetensors(path, {{"x", arange(0, 4, DType::f32)}});
  Tensor x;
  {
    SafetensorsFile f = SafetensorsFile::open(path);
    x = f.get("x");
  }
  EXPECT_EQ(x.to_vector(), (std::vector<double>{0, 1, 2, 3}));
  x.fill_(7.0);  // copy-on-write mapping: allowed, private to this process
  EXPECT_EQ(x.to_vector(), (std::vector<double>(4, 7.0)));
  EXPECT_EQ(SafetensorsFile::open(path).get("x").to_vector(), (std::vector<double>{0, 1, 2, 3}));
}

TEST(Safetensors, SavingOverAnExistingFileReplacesIt) {
  TempDir dir("ingot_st_");
  std::string path = dir.file("w.safetensors");
  save_safetensors(path, {{"x", ones({2}, DType::f32)}});
  save_safetensors(path, {{"y", zeros({3}, DType::f64)}});
  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.has("x"));
  EXPECT_EQ(f.get("y").to_vector(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1) << "a temp file was left";
}

// A tensor whose host copy throws half-way through the write: here one claiming to live on a CUDA device
// that does not exist (no such device, or a build without CUDA).
TEST(Safetensors, FailedSaveLeavesTheExistingFileUntouched) {
  TempDir dir("ingot_st_");
  std::string path = dir.file("keep.safetensors");
  save_safetensors(path, {{"x", arange(0, 5, DType::f32)}});
  std::string before = read_file(path);

  auto blob = std::make_shared<std::vector<float>>(4, 1.0f);
  Tensor unreachable = from_blob(blob, blob->data(), {4}, DType::f32, Device::cuda(1 << 20));
  EXPECT_THROW(save_safetensors(path, {{"good", ones({8}, DType::f32)}, {"bad", unreachable}}), Error);
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1) << "a temp file was left";
}

// The streaming writer is what save_safetensors runs on: declared entries give the same file as whole tensors,
// tensors are asked for in data order one at a time, and converted, transposed inputs give the bytes of their
// whole contiguous conversion.
TEST(SafetensorsStreamed, DeclaredEntriesWriteTheFileSaveSafetensorsWrites) {
  manual_seed(5);
  TempDir dir("ingot_st_");
  Tensor a = randn({3, 4}, DType::f32), b = randn({5}, DType::f64), c = randn({700, 900}, DType::f32);
  Tensor ct = c.as_strided({900, 700}, {1, 900}, 0);  // transposed, not contiguous: written in slabs
  save_safetensors(dir.file("whole.safetensors"),
                   {{"a", a.to(DType::bf16)}, {"b", b}, {"c", ct.contiguous_raw().to(DType::bf16)}},
                   {{"format", "pt"}});
  std::vector<SafetensorsEntry> entries = {
      {"a", DType::bf16, {3, 4}}, {"b", DType::f64, {5}}, {"c", DType::bf16, {900, 700}}};
  EXPECT_EQ(safetensors_data_order(entries), (std::vector<size_t>{1, 0, 2}));
  std::vector<size_t> asked;
  write_safetensors_streamed(dir.file("streamed.safetensors"), entries, {{"format", "pt"}}, [&](size_t k) {
    asked.push_back(k);
    return std::vector<Tensor>{a, b, ct}[k];
  });
  EXPECT_EQ(asked, (std::vector<size_t>{1, 0, 2}));
  EXPECT_EQ(read_file(dir.file("streamed.safetensors")), read_file(dir.file("whole.safetensors")));
}

// Slabs: a 16 MiB transposed f32 tensor written as bf16 never has a whole converted or contiguous copy.
TEST(SafetensorsStreamed, NonContiguousTensorsAreConvertedInSlabsNotWhole) {
  TempDir dir("ingot_st_");
  Tensor big = randn({2048, 2048}, DType::f32).as_strided({2048, 2048}, {1, 2048}, 0);
  Allocator& alloc = cpu_allocator();
  const int64_t before = alloc.stats().allocated_bytes;
  alloc.reset_peak();
  write_safetensors_streamed(dir.file("big.safetensors"), {{"big", DType::bf16, {2048, 2048}}}, {},
                             [&](size_t) { return big; });
  const int64_t extra = alloc.stats().peak_allocated_bytes - before;
  EXPECT_LE(extra, int64_t{7} << 20) << "more than a slab (4 MiB of f32 + its 2 MiB of bf16) was allocated";
  Tensor back = SafetensorsFile::open(dir.file("big.safetensors")).get("big");
  EXPECT_EQ(bytes_of(back), bytes_of(big.contiguous_raw().to(DType::bf16)));
}

TEST(SafetensorsStreamed, AFailureMidStreamLeavesThePreviousFileAndNoTempFile) {
  TempDir dir("ingot_st_");
  std::string path = dir.file("keep.safetensors");
  save_safetensors(path, {{"x", arange(0, 5, DType::f32)}});
  const std::string before = read_file(path);
  std::vector<SafetensorsEntry> entries = {{"x", DType::f32, {4}}, {"y", DType::f32, {4}}, {"z", DType::f32, {4}}};
  EXPECT_THROW(write_safetensors_streamed(path, entries, {},
                                          [&](size_t k) -> Tensor {
                                            if (k == 1) INGOT_FAIL("gather failed");
                                            return ones({4}, DType::f32);
                                          }),
               Error);
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1) << "a temp file was left";
  // A tensor that does not match its declaration is refused the same way.
  EXPECT_THROW(write_safetensors_streamed(path, entries, {}, [&](size_t) { return ones({5}, DType::f32); }), Error);
  EXPECT_EQ(read_file(path), before);
}

}  // namespace
}  // namespace ingot
