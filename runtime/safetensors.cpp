#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "runtime/file_util.h"

namespace ingot {
namespace {

using nlohmann::json;

// The Hugging Face reference implementation's limit; a larger length means a corrupt or hostile file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

template <typename... Args>
[[noreturn]] void bad_file(const std::string& path, const Args&... args) {
  INGOT_FAIL("safetensors: '", path, "': ", args...);
}

std::string supported_dtypes() {
  std::string s;
  for (DType t : kAllDTypes) s += (s.empty() ? "" : ", ") + std::string(dtype_st_name(t));
  return s;
}

// Note [Duplicate keys]: nlohmann::json silently keeps one of two equal keys, which would hide a duplicated
// tensor name. A parser callback sees every key before that happens, so duplicates are caught here.
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> open_objects;
  std::string top_key;  // the most recent key of the outermost object (the tensor being parsed)
  std::string problem;  // empty when no duplicate was seen

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      bool fresh = open_objects.back().insert(key).second;
      if (open_objects.size() == 1) top_key = key;
      if (!fresh && problem.empty()) {
        problem = open_objects.size() == 1 ? "duplicate tensor name '" + key + "' in the header"
                                           : "key '" + key + "' appears twice in the entry of '" + top_key + "'";
      }
    }
    return true;
  }
};

// A JSON integer as int64, or false when it is not an integer that fits.
bool as_int64(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  return false;
}

const json& field(const std::string& path, const std::string& name, const json& entry, const char* key) {
  auto it = entry.find(key);
  if (it == entry.end()) bad_file(path, "tensor '", name, "': missing '", key, "'");
  return *it;
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const json& entry) {
  if (!entry.is_object())
    bad_file(path, "tensor '", name, "': expected an object with dtype, shape and data_offsets, got ",
             entry.type_name());
  TensorInfo ti;

  const json& dt = field(path, name, entry, "dtype");
  if (!dt.is_string()) bad_file(path, "tensor '", name, "': 'dtype' must be a string, got ", dt.type_name());
  if (!try_parse_st_dtype(dt.get_ref<const std::string&>(), &ti.dtype))
    bad_file(path, "tensor '", name, "': unsupported dtype '", dt.get_ref<const std::string&>(),
             "' (supported: ", supported_dtypes(), ")");

  const json& shape = field(path, name, entry, "shape");
  if (!shape.is_array())
    bad_file(path, "tensor '", name, "': 'shape' must be an array of integers, got ", shape.type_name());
  int64_t elems = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = 0;
    if (!shape[i].is_number_integer())
      bad_file(path, "tensor '", name, "': shape dimension ", i, " is not an integer: ", shape[i].dump());
    if (!as_int64(shape[i], &d) || d < 0)
      bad_file(path, "tensor '", name, "': shape dimension ", i, " is ", shape[i].dump(),
               ", expected a non-negative 64-bit integer");
    ti.shape.push_back(d);
    // Checked in order (even past a 0) because numel() multiplies in order too.
    if (__builtin_mul_overflow(elems, d, &elems))
      bad_file(path, "tensor '", name, "': shape ", shape.dump(), " has more elements than fit in 64 bits");
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(elems), itemsize(ti.dtype), &nbytes))
    bad_file(path, "tensor '", name, "': shape ", shape.dump(), " of ", dt.get_ref<const std::string&>(),
             " needs more than 2^64 bytes");

  const json& offs = field(path, name, entry, "data_offsets");
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
    bad_file(path, "tensor '", name, "': 'data_offsets' must be two non-negative integers [begin, end], got ",
             offs.dump());
  ti.begin = offs[0].get<uint64_t>();
  ti.end = offs[1].get<uint64_t>();
  if (ti.begin > ti.end)
    bad_file(path, "tensor '", name, "': data_offsets ", offs.dump(), " have begin > end");
  if (ti.end - ti.begin != nbytes)
    bad_file(path, "tensor '", name, "': data_offsets ", offs.dump(), " span ", ti.end - ti.begin, " bytes but ",
             dt.get<std::string>(), " ", shape_str(ti.shape), " needs ", nbytes);
  return ti;
}

// The tensors must tile the data buffer exactly: start at 0, no overlap, no gap, nothing after the last one.
void check_coverage(const std::string& path, const std::vector<std::string>& order,
                    const std::unordered_map<std::string, TensorInfo>& infos, uint64_t buffer_bytes) {
  uint64_t pos = 0;
  const std::string* prev = nullptr;
  for (const std::string& name : order) {
    const TensorInfo& ti = infos.at(name);
    if (!prev && ti.begin != 0)
      bad_file(path, "tensor '", name, "' is the first in the data buffer but starts at byte ", ti.begin,
               ", expected 0");
    if (prev && ti.begin < pos)
      bad_file(path, "tensors '", *prev, "' (bytes ", infos.at(*prev).begin, "..", pos, ") and '", name,
               "' (bytes ", ti.begin, "..", ti.end, ") overlap");
    if (prev && ti.begin > pos)
      bad_file(path, "gap of ", ti.begin - pos, " bytes in the data buffer between tensor '", *prev,
               "' (ends at ", pos, ") and tensor '", name, "' (starts at ", ti.begin, ")");
    pos = ti.end;
    prev = &name;
  }
  if (pos > buffer_bytes)
    bad_file(path, "tensor '", *prev, "' ends at byte ", pos, " but the data buffer has only ", buffer_bytes,
             " bytes (truncated file?)");
  if (pos < buffer_bytes)
    bad_file(path, "the data buffer has ", buffer_bytes, " bytes but the tensors cover only ", pos, " (",
             buffer_bytes - pos, " trailing bytes)");
}

struct Mapping {
  std::shared_ptr<void> owner;
  const char* bytes = nullptr;
  uint64_t size = 0;
};

Mapping map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad_file(path, "cannot open: ", errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    bad_file(path, "cannot stat: ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    bad_file(path, "not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    bad_file(path, "file is ", size, " bytes, shorter than the 8-byte header length");
  }
  // Copy-on-write so that in-place ops on a loaded tensor work (and never reach the file) instead of faulting.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) bad_file(path, "cannot mmap ", size, " bytes: ", errno_text(err));
  Mapping m;
  m.owner = std::shared_ptr<void>(p, [size](void* q) { ::munmap(q, size); });
  m.bytes = static_cast<const char*>(p);
  m.size = size;
  return m;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  Mapping m = map_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(m.bytes[i]);
  if (n > kMaxHeaderBytes)
    bad_file(path, "header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes (corrupt file?)");
  if (n > m.size - 8)
    bad_file(path, "header length ", n, " is larger than the ", m.size - 8,
             " bytes that follow the length field (truncated file?)");

  DuplicateKeyFinder dups;
  json header;
  try {
    header = json::parse(m.bytes + 8, m.bytes + 8 + n, std::ref(dups));
  } catch (const json::exception& e) {
    bad_file(path, "header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) bad_file(path, "header must be a JSON object, got ", header.type_name());
  if (!dups.problem.empty()) bad_file(path, dups.problem);

  SafetensorsFile f;
  f.path_ = path;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object())
        bad_file(path, "'", kMetadataKey, "' must be an object of strings, got ", entry.type_name());
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          bad_file(path, "'", kMetadataKey, "' value of '", k, "' must be a string, got ", v.type_name(), " ",
                   v.dump());
        f.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    f.infos_[name] = parse_entry(path, name, entry);
    f.names_.push_back(name);
  }
  // Ties (zero-size tensors) are broken by name so the order is deterministic.
  std::sort(f.names_.begin(), f.names_.end(), [&](const std::string& a, const std::string& b) {
    const TensorInfo &x = f.infos_.at(a), &y = f.infos_.at(b);
    return std::tie(x.begin, x.end, a) < std::tie(y.begin, y.end, b);
  });
  check_coverage(path, f.names_, f.infos_, m.size - 8 - n);
  f.data_ = m.bytes + 8 + n;
  f.mapping_ = std::move(m.owner);
  return f;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) {
    std::string some;
    for (size_t i = 0; i < names_.size() && i < 8; ++i) some += (i ? ", " : "") + names_[i];
    if (names_.size() > 8) some += ", ...";
    bad_file(path_, "no tensor named '", name, "' (the file has ", names_.size(), " tensors: ", some, ")");
  }
  return it->second;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  char* p = const_cast<char*>(data_ + ti.begin);  // writable: the mapping is private copy-on-write
  if (reinterpret_cast<uintptr_t>(p) % itemsize(ti.dtype) == 0)
    return from_blob(mapping_, p, ti.shape, ti.dtype, Device::cpu());
  Tensor t = empty(ti.shape, ti.dtype);
  std::memcpy(t.data_ptr(), p, ti.end - ti.begin);
  return t;
}

namespace {

// Bytes converted, made contiguous and copied to host at a time when a tensor is not already host bytes.
constexpr int64_t kSlabBytes = int64_t{4} << 20;

// Appends t's elements in row-major order as `dtype`, one slab of leading-dimension rows at a time.
void write_tensor_bytes(std::FILE* f, const Tensor& t, DType dtype) {
  if (t.device().is_cpu() && t.dtype() == dtype && t.is_contiguous()) {
    write_bytes(f, t.data_ptr(), t.nbytes());
    return;
  }
  if (t.dim() == 0 || t.numel() == 0) {
    Tensor host = t.to(dtype).to(Device::cpu()).contiguous_raw();
    write_bytes(f, host.data_ptr(), host.nbytes());
    return;
  }
  const int64_t rows = t.shape()[0];
  const int64_t row_bytes = t.numel() / rows * static_cast<int64_t>(std::max(itemsize(dtype), itemsize(t.dtype())));
  const int64_t per_slab = std::max<int64_t>(1, kSlabBytes / std::max<int64_t>(row_bytes, 1));
  for (int64_t r = 0; r < rows; r += per_slab) {
    Shape shape = t.shape();
    shape[0] = std::min(per_slab, rows - r);
    Tensor slab = t.as_strided(shape, t.strides(), t.offset() + r * t.strides()[0]);
    Tensor host = slab.contiguous_raw().to(dtype).to(Device::cpu()).contiguous_raw();
    write_bytes(f, host.data_ptr(), host.nbytes());
  }
}

}  // namespace

std::vector<size_t> safetensors_data_order(const std::vector<SafetensorsEntry>& entries) {
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return itemsize(entries[a].dtype) > itemsize(entries[b].dtype); });
  return order;
}

void write_safetensors_streamed(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<Tensor(size_t entry)>& produce) {
  std::set<std::string> seen;
  for (const SafetensorsEntry& e : entries) {
    INGOT_CHECK(!e.name.empty(), "save_safetensors: '", path, "': tensor names must be non-empty");
    INGOT_CHECK(e.name != kMetadataKey, "save_safetensors: '", path, "': '", kMetadataKey,
                "' is reserved and cannot name a tensor");
    INGOT_CHECK(seen.insert(e.name).second, "save_safetensors: '", path, "': duplicate tensor name '", e.name, "'");
  }
  const std::vector<size_t> order = safetensors_data_order(entries);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (size_t i : order) {
    const SafetensorsEntry& e = entries[i];
    const uint64_t nbytes = static_cast<uint64_t>(numel(e.shape)) * itemsize(e.dtype);
    header[e.name] = {{"dtype", std::string(dtype_st_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    INGOT_FAIL("save_safetensors: '", path, "': tensor names and metadata must be valid UTF-8: ", e.what());
  }
  // Padding keeps the data buffer 8-byte aligned, so every tensor in it is aligned to its itemsize.
  text.append((8 - text.size() % 8) % 8, ' ');

  write_file_atomic(path, [&](std::FILE* f) {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    write_bytes(f, len, 8);
    write_bytes(f, text.data(), text.size());
    for (size_t i : order) {
      const SafetensorsEntry& e = entries[i];
      Tensor t = produce(i);
      INGOT_CHECK(t.defined(), "save_safetensors: '", path, "': tensor '", e.name, "' is undefined");
      INGOT_CHECK(t.shape() == e.shape, "save_safetensors: '", path, "': tensor '", e.name,
                  "' was declared with shape ", shape_str(e.shape), " but has shape ", shape_str(t.shape()));
      INGOT_CHECK(t.dtype() == e.dtype || (is_floating(t.dtype()) && is_floating(e.dtype)), "save_safetensors: '",
                  path, "': tensor '", e.name, "' is ", dtype_name(t.dtype()), ", which cannot be written as ",
                  dtype_name(e.dtype));
      write_tensor_bytes(f, t, e.dtype);
    }
  });
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) {
    INGOT_CHECK(t.defined(), "save_safetensors: '", path, "': tensor '", name, "' is undefined");
    entries.push_back({name, t.dtype(), t.shape()});
  }
  write_safetensors_streamed(path, entries, metadata, [&](size_t k) { return tensors[k].second; });
}

}  // namespace ingot
