// Tensor storage, views, copies and debug printing.
#include "core/tensor.h"

#include <cstring>

#ifdef MT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace moetrain {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

Storage::Storage(size_t bytes, Device dev, MemCategory cat)
    : bytes_(bytes), device_(dev), category_(cat), owning_(true) {
  data_ = allocator_for(dev).allocate(bytes, cat);
}

Storage::Storage(void* data, size_t bytes, Device dev, std::function<void()> keepalive)
    : data_(data), bytes_(bytes), device_(dev), owning_(false), release_(std::move(keepalive)) {}

Storage::~Storage() {
  if (owning_ && data_) allocator_for(device_).deallocate(data_, bytes_, category_);
  if (release_) release_();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device dev, MemCategory cat) {
  for (auto d : shape) MT_CHECK(d >= 0, "[tensor] negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), dev, cat);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device dev, MemCategory cat) {
  Tensor t = empty(shape, dtype, dev, cat);
  t.zero_();
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device dev,
                         std::function<void()> keepalive) {
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                         dev, std::move(keepalive));
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& v, const Shape& shape, DType dtype) {
  MT_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape),
           "[tensor] from_floats: {} values for shape {}", v.size(), shape_str(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < v.size(); ++i) store_from_double(t.data_ptr(), dtype, i, v[i]);
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& v, const Shape& shape) {
  MT_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape),
           "[tensor] from_ints: {} values for shape {}", v.size(), shape_str(shape));
  Tensor t = empty(shape, DType::kI32);
  if (!v.empty()) std::memcpy(t.data_ptr(), v.data(), v.size() * 4);
  return t;
}

Tensor Tensor::scalar(float v) { return from_floats({v}, {}); }

int64_t Tensor::size(int d) const {
  int n = dim();
  if (d < 0) d += n;
  MT_CHECK(d >= 0 && d < n, "[tensor] dim {} out of range for {}", d, desc());
  return shape_[d];
}

int64_t Tensor::stride(int d) const {
  int n = dim();
  if (d < 0) d += n;
  MT_CHECK(d >= 0 && d < n, "[tensor] dim {} out of range for {}", d, desc());
  return strides_[d];
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  MT_CHECK(storage_, "[tensor] access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

void Tensor::check_type_(size_t sz) const {
  MT_CHECK(sz == dtype_size(dtype_), "[tensor] typed access of {}-byte elements to a {} tensor", sz,
           dtype_name(dtype_));
}

// Rows with a stride of their own (a column block of a wider matrix): dim 0 keeps its size and
// stride, and the contiguous rest of each row is viewed as shape[1..].
Tensor Tensor::view_rows_(const Shape& shape) const {
  MT_CHECK(dim() >= 1 && !shape.empty() && shape[0] == shape_[0],
           "[tensor] view {} of the row-strided {} must keep dim 0", shape_str(shape), desc());
  Tensor row = *this;
  row.shape_.erase(row.shape_.begin());
  row.strides_.erase(row.strides_.begin());
  MT_CHECK(row.is_contiguous(), "[tensor] view of a non-contiguous tensor {}", desc());
  Tensor t = *this;
  const Shape inner = row.view(Shape(shape.begin() + 1, shape.end())).shape_;
  t.shape_.assign(1, shape_[0]);
  t.shape_.insert(t.shape_.end(), inner.begin(), inner.end());
  t.strides_ = contiguous_strides(t.shape_);
  t.strides_[0] = strides_[0];
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  if (!is_contiguous() && dim() >= 1 && !shape.empty() && shape[0] == shape_[0] && shape_[0] > 1) return view_rows_(shape);
  MT_CHECK(is_contiguous(), "[tensor] view of a non-contiguous tensor {}", desc());
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MT_CHECK(infer < 0, "[tensor] view {} has more than one -1", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MT_CHECK(known > 0 && numel() % known == 0, "[tensor] cannot view {} as {}", desc(), shape_str(shape));
    s[infer] = numel() / known;
  }
  MT_CHECK(shape_numel(s) == numel(), "[tensor] cannot view {} as {}", desc(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int d, int64_t start, int64_t end) const {
  if (d < 0) d += dim();
  MT_CHECK(d >= 0 && d < dim(), "[tensor] slice dim {} out of range for {}", d, desc());
  MT_CHECK(0 <= start && start <= end && end <= shape_[d], "[tensor] slice [{}, {}) out of range of dim {} of {}",
           start, end, d, desc());
  Tensor t = *this;
  t.offset_ += static_cast<size_t>(start * strides_[d]) * dtype_size(dtype_);
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += dim();
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  if (d0 < 0) d0 += dim();
  if (d1 < 0) d1 += dim();
  MT_CHECK(d0 >= 0 && d0 < dim() && d1 >= 0 && d1 < dim(), "[tensor] transpose({}, {}) of {}", d0, d1, desc());
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone(category());
}

Tensor Tensor::clone(MemCategory cat) const {
  Tensor out = empty(shape_, dtype_, device(), cat);
  if (is_contiguous()) {
    copy_bytes(out.data_ptr(), out.device(), data_ptr(), device(), nbytes());
    return out;
  }
  MT_CHECK(device().is_cpu(), "[tensor] clone of a strided {} tensor needs ops on that device", device().str());
  // Strided CPU gather, element by element (debug and tools path).
  const size_t es = dtype_size(dtype_);
  const char* base = static_cast<const char*>(data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  std::vector<int64_t> idx(dim(), 0);
  for (int64_t n = 0; n < numel(); ++n) {
    int64_t off = 0;
    for (int i = 0; i < dim(); ++i) off += idx[i] * strides_[i];
    std::memcpy(dst + n * es, base + off * es, es);
    for (int i = dim() - 1; i >= 0; --i) {
      if (++idx[i] < shape_[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

Tensor Tensor::to(Device dev, MemCategory cat) const {
  Tensor src = contiguous();
  Tensor out = empty(shape_, dtype_, dev, cat);
  copy_bytes(out.data_ptr(), dev, src.data_ptr(), src.device(), nbytes());
  return out;
}

Tensor Tensor::to(DType dt) const {
  MT_CHECK(device().is_cpu(), "[tensor] dtype conversion of a {} tensor: use the cast op", device().str());
  Tensor src = contiguous();
  Tensor out = empty(shape_, dt, Device::cpu(), category());
  if (dt == dtype_) {
    std::memcpy(out.data_ptr(), src.data_ptr(), nbytes());
    return out;
  }
  const int64_t n = numel();
  if (dtype_ == DType::kBF16 && dt == DType::kF32) {
    const uint16_t* s = src.data<uint16_t>();
    float* d = out.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
  } else if (dtype_ == DType::kF32 && dt == DType::kBF16) {
    const float* s = src.data<float>();
    uint16_t* d = out.data<uint16_t>();
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) store_from_double(out.data_ptr(), dt, i, load_as_double(src.data_ptr(), dtype_, i));
  }
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  MT_CHECK(shape_ == src.shape_ && dtype_ == src.dtype_, "[tensor] copy_from {} into {}", src.desc(), desc());
  MT_CHECK(is_contiguous() && src.is_contiguous(), "[tensor] copy_from needs contiguous tensors");
  copy_bytes(data_ptr(), device(), src.data_ptr(), src.device(), nbytes());
}

void Tensor::zero_() {
  if (!numel()) return;
  MT_CHECK(is_contiguous(), "[tensor] zero_ of a non-contiguous tensor {}", desc());
  if (device().is_cpu()) {
    std::memset(data_ptr(), 0, nbytes());
  } else {
#ifdef MT_WITH_CUDA
    MT_CUDA_CHECK(cudaMemset(data_ptr(), 0, nbytes()));
#endif
  }
}

void Tensor::fill_(double v) {
  MT_CHECK(device().is_cpu(), "[tensor] fill_ on {} needs a device op", device().str());
  MT_CHECK(is_contiguous(), "[tensor] fill_ of a non-contiguous tensor");
  for (int64_t i = 0; i < numel(); ++i) store_from_double(data_ptr(), dtype_, i, v);
}

double Tensor::get(int64_t i) const {
  MT_CHECK(device().is_cpu(), "[tensor] get() on a {} tensor", device().str());
  MT_CHECK(i >= 0 && i < numel(), "[tensor] index {} out of range for {}", i, desc());
  int64_t off = 0, rem = i;
  for (int d = dim() - 1; d >= 0; --d) {
    off += (rem % shape_[d]) * strides_[d];
    rem /= shape_[d];
  }
  return load_as_double(data_ptr(), dtype_, static_cast<size_t>(off));
}

void Tensor::set(int64_t i, double v) {
  MT_CHECK(device().is_cpu(), "[tensor] set() on a {} tensor", device().str());
  MT_CHECK(i >= 0 && i < numel(), "[tensor] index {} out of range for {}", i, desc());
  int64_t off = 0, rem = i;
  for (int d = dim() - 1; d >= 0; --d) {
    off += (rem % shape_[d]) * strides_[d];
    rem /= shape_[d];
  }
  store_from_double(data_ptr(), dtype_, static_cast<size_t>(off), v);
}

std::vector<float> Tensor::to_floats() const {
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<float> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[i] = static_cast<float>(c.get(i));
  return v;
}

float Tensor::item() const {
  MT_CHECK(numel() == 1, "[tensor] item() of {} with {} elements", desc(), numel());
  return to_floats()[0];
}

std::string Tensor::desc() const {
  if (!defined()) return "undefined";
  return fmt::format("{} {} {}", dtype_name(dtype_), shape_str(shape_), device().str());
}

std::string Tensor::str(int64_t max_elems) const {
  if (!defined()) return "Tensor[undefined]";
  std::string s = "Tensor[" + desc() + "] {";
  auto v = to_floats();
  int64_t n = std::min<int64_t>(numel(), max_elems);
  for (int64_t i = 0; i < n; ++i) s += fmt::format("{}{:.6g}", i ? ", " : "", v[i]);
  if (numel() > n) s += ", ...";
  return s + "}";
}

void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* name) {
  MT_CHECK(t.defined(), "[{}] {} is undefined, expected shape {}", op, name, shape_str(expected));
  bool ok = t.dim() == static_cast<int>(expected.size());
  for (size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i] < 0 || expected[i] == t.shape()[i];
  MT_CHECK(ok, "[{}] {} has shape {}, expected {}", op, name, shape_str(t.shape()), shape_str(expected));
}

void check_dtype(const Tensor& t, DType expected, const char* op, const char* name) {
  MT_CHECK(t.dtype() == expected, "[{}] {} has dtype {}, expected {}", op, name, dtype_name(t.dtype()),
           dtype_name(expected));
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (!bytes) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef MT_WITH_CUDA
  MT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
  MT_FAIL("[tensor] copy between {} and {} in a build without CUDA", src_dev.str(), dst_dev.str());
#endif
}

}  // namespace moetrain
