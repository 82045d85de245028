// Hugging Face safetensors files: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
// then the data buffer, which the tensors tile exactly (offsets are relative to its start).
//
// Reading maps the file and validates the whole header before anything is exposed; a bad file fails with a
// message naming the file, the tensor and the problem. Tensors come back as zero-copy CPU views of the
// mapping. Writing is atomic (runtime/file_util.h): a failed save leaves an existing file untouched.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace ingot {

struct TensorInfo {
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws ingot::Error describing the first problem found.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in data-buffer order.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  // A CPU tensor viewing the mapping (it keeps the mapping alive). The mapping is copy-on-write: writing to
  // the tensor never changes the file. A tensor whose bytes are not aligned to its itemsize (possible in files
  // from other writers) is copied into aligned memory instead.
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;
  const char* data_ = nullptr;  // start of the data buffer inside the mapping
  std::vector<std::string> names_;
  std::unordered_map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// One tensor of a file written by write_safetensors_streamed: what its header entry says.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
};

// The order in which write_safetensors_streamed lays out (and asks for) `entries`: grouped by decreasing
// itemsize, stable, so every tensor starts aligned to its itemsize. Indices into `entries`.
std::vector<size_t> safetensors_data_order(const std::vector<SafetensorsEntry>& entries);

// Streams a safetensors file to `path` atomically (write_file_atomic: temp file, fsync, rename): the header, with
// every entry's dtype, shape and offsets, is written first, then produce(k) is called for each entry k in
// safetensors_data_order and its bytes appended before the next call, so only one tensor need exist at a time.
// produce(k) returns a tensor of entry k's shape on any device, in any floating or matching dtype and with any
// strides; it is converted, made contiguous and copied to host in slabs of at most a few MiB, never whole. If
// produce throws, or writing fails, `path` keeps its previous contents and no temp file is left.
void write_safetensors_streamed(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<Tensor(size_t entry)>& produce);

// Writes `tensors` (any device, dtype and strides; copied to host one at a time) to `path` atomically.
// Names must be unique and non-empty. The data buffer keeps the given order, except that tensors are
// grouped by decreasing itemsize (stable) so every tensor starts aligned to its itemsize; the header is
// padded with spaces to a multiple of 8 bytes.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace ingot
