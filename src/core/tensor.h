// Tensor: dtype, shape, strides (in elements), device, and shared storage. Owning tensors hold
// memory from the device's allocator, accounted under a MemCategory; views (slice, view,
// transpose, from_blob) share or borrow storage without copying.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/check.h"
#include "core/dtype.h"

namespace moetrain {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);

class Storage {
 public:
  // Owning: memory from `alloc`, returned to it on destruction.
  Storage(size_t bytes, Device dev, MemCategory cat);
  // Borrowing: `data` stays owned by someone else; `keepalive` (may be empty) runs on release.
  Storage(void* data, size_t bytes, Device dev, std::function<void()> keepalive);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  MemCategory category() const { return category_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  MemCategory category_ = MemCategory::kOther;
  bool owning_ = false;
  std::function<void()> release_;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype, Device dev = Device::cpu(),
                      MemCategory cat = MemCategory::kOther);
  static Tensor zeros(const Shape& shape, DType dtype, Device dev = Device::cpu(),
                      MemCategory cat = MemCategory::kOther);
  // Non-owning view of external memory (mmap'd files, caller buffers).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device dev = Device::cpu(),
                          std::function<void()> keepalive = {});
  // CPU tensors from host values (converted to `dtype`).
  static Tensor from_floats(const std::vector<float>& v, const Shape& shape, DType dtype = DType::kF32);
  static Tensor from_ints(const std::vector<int32_t>& v, const Shape& shape);
  static Tensor scalar(float v);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  MemCategory category() const { return storage_ ? storage_->category() : MemCategory::kOther; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t stride(int d) const;
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  size_t element_size() const { return dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* data_ptr() const;
  template <typename T> T* data() const { check_type_(sizeof(T)); return static_cast<T*>(data_ptr()); }

  // Views (no copy). view() needs a contiguous tensor, or one whose rows (dim 0) have a stride of
  // their own and are contiguous inside, viewed with dim 0 kept; one dim may be -1.
  Tensor view(const Shape& shape) const;
  Tensor slice(int dim, int64_t start, int64_t end) const;  // [start, end) along dim
  Tensor select(int dim, int64_t index) const;              // drops dim
  Tensor transpose(int d0, int d1) const;
  Tensor flatten() const { return view({numel()}); }

  // Copies.
  Tensor contiguous() const;
  Tensor clone(MemCategory cat = MemCategory::kOther) const;
  Tensor to(Device dev, MemCategory cat = MemCategory::kOther) const;
  Tensor to(DType dtype) const;  // CPU only: use ops::cast on a device
  void copy_from(const Tensor& src);  // same shape and dtype; any devices; both contiguous
  void zero_();
  void fill_(double v);  // CPU only

  // CPU element access for tests and tools (any dtype).
  double get(int64_t flat_index) const;
  void set(int64_t flat_index, double v);
  std::vector<float> to_floats() const;  // any device, any float dtype
  float item() const;

  std::string str(int64_t max_elems = 8) const;  // "Tensor[f32 [2, 3] cpu] {...}"
  std::string desc() const;                      // "f32 [2, 3] cpu"

 private:
  void check_type_(size_t sz) const;
  Tensor view_rows_(const Shape& shape) const;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes from storage start
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::kF32;
};

Shape contiguous_strides(const Shape& shape);

// Shape checks used at op entry: "[op] name has shape [..], expected [..]".
void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* name);
void check_dtype(const Tensor& t, DType expected, const char* op, const char* name);

// Copy between host and device memory (either direction, or host-host); synchronous.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);

}  // namespace moetrain
