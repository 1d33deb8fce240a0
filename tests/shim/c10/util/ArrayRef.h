#pragma once

// Harness stand-in for <c10/util/ArrayRef.h>: a non-owning view of a
// contiguous array, built from one element, a pointer and a length, a C
// array or a std::vector, as c10's is.

#include <cstddef>
#include <vector>

namespace c10 {

template <typename T>
class ArrayRef {
 public:
  constexpr ArrayRef() = default;
  constexpr ArrayRef(const T& one) : data_(&one), size_(1) {}
  constexpr ArrayRef(const T* data, size_t size) : data_(data), size_(size) {}
  template <size_t N>
  constexpr ArrayRef(const T (&array)[N]) : data_(array), size_(N) {}
  template <typename A>
  ArrayRef(const std::vector<T, A>& v) : data_(v.data()), size_(v.size()) {}

  constexpr const T* begin() const {
    return data_;
  }
  constexpr const T* end() const {
    return data_ + size_;
  }
  constexpr const T* data() const {
    return data_;
  }
  constexpr size_t size() const {
    return size_;
  }
  constexpr bool empty() const {
    return size_ == 0;
  }
  constexpr const T& operator[](size_t i) const {
    return data_[i];
  }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

} // namespace c10
