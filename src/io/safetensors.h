// safetensors read (mmap, zero-copy views) and write, single files and sharded checkpoints.
// Format (SPEC.md section 4): u64 little-endian N, N bytes of JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, padded
// with spaces to a multiple of 8, then the data; offsets are relative to the first data byte.
// Sharded: model.safetensors.index.json = {"metadata": {"total_size"}, "weight_map": {name: file}}.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moetrain {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as in the header: "BF16", "F32", "F64", ...
  bool dtype_known = false;  // representable as a moetrain DType
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data section
};

// A read-only, memory-mapped safetensors file. The header is validated on open: JSON shape,
// dtypes, shapes, and that every tensor's byte range matches its shape and lies inside the
// file without overlapping another; a truncated or corrupt file is an error naming the file
// (and the tensor where one is at fault).
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // header order
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t header_size() const { return header_size_; }  // N (JSON + padding)
  // Raw bytes of a tensor (inside the mapping; valid while this object lives).
  const uint8_t* data(const SafetensorsEntry& e) const { return data_ + e.begin; }
  // A zero-copy CPU view; the tensor keeps the mapping alive. Throws for unknown dtypes.
  // Note: the view is read-only memory (PROT_READ); do not write through it.
  Tensor tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* data_ = nullptr;
  size_t header_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;
};

// Every tensor of a checkpoint directory: model.safetensors.index.json with its shards, or a
// single model.safetensors, or (no index) every *.safetensors file in the directory.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open_dir(const std::string& dir);
  const std::string& dir() const { return dir_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  const SafetensorsFile& file_of(const std::string& name) const;
  Tensor tensor(const std::string& name) const { return file_of(name).tensor(name); }
  size_t num_files() const { return files_.size(); }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // name -> index into files_
};

// One tensor to write: its bytes are produced on demand by `fill` into a buffer of
// shape_numel(shape) * dtype_size(dtype) bytes, so a writer never holds the whole model.
struct TensorWriteSpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::function<void(void* dst)> fill;
  size_t nbytes() const { return static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype); }
};

// A spec that writes `t` (any device, contiguous or not) converted to `dtype`.
TensorWriteSpec tensor_write_spec(const std::string& name, const Tensor& t, DType dtype);
TensorWriteSpec tensor_write_spec(const std::string& name, const Tensor& t);  // t's own dtype

// Writes one safetensors file in the order given (data offsets follow that order; the header
// lists __metadata__ first). Written to `path`.tmp, flushed, then renamed over `path`.
void write_safetensors(const std::string& path, const std::vector<TensorWriteSpec>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

struct ShardOptions {
  uint64_t max_shard_bytes = 5000000000ull;  // 5 GB, as transformers' save_pretrained
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  int threads = 0;  // shards written in parallel; 0 = min(shards, MT_NUM_THREADS)
};
// Splits `tensors` (in order) into shards of at most max_shard_bytes (a tensor larger than
// that gets a shard of its own), each shard's tensors sorted by name as safetensors' save_file
// writes them, into `dir`: one file model.safetensors when a
// single shard suffices, else model-0000i-of-0000n.safetensors plus model.safetensors.index.json.
// Returns the file names written.
std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<TensorWriteSpec>& tensors,
                                                   const ShardOptions& opt = {});

// Converts n contiguous host elements between float dtypes (bf16 <-> f32 fast paths).
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

}  // namespace moetrain
