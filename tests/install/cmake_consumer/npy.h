// Minimal .npy (NumPy format 1.0-3.0) reader and writer: C-order, little-endian arrays only,
// which is what numpy.save writes on the machines we run on. Throws std::runtime_error.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace npy {

struct Array {
  std::string descr;           // numpy dtype string, e.g. "<f4"
  std::vector<int64_t> shape;  // empty for a scalar
  std::vector<char> data;      // raw C-order elements

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Element size of a supported dtype string, or 0.
inline size_t item_size(const std::string& descr) {
  if (descr == "<f2") return 2;
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f8" || descr == "<i8") return 8;
  if (descr == "|b1" || descr == "|u1" || descr == "|i1") return 1;
  return 0;
}

inline Array read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
    throw std::runtime_error(path + ": not a .npy file");
  }
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    throw std::runtime_error(path + ": unsupported .npy version " + std::to_string(major));
  }
  std::string header(header_len, '\0');
  if (!f.read(&header[0], header_len)) throw std::runtime_error(path + ": truncated header");

  Array a;
  const size_t d = header.find("'descr':");
  const size_t q1 = header.find('\'', d + 8);
  const size_t q2 = header.find('\'', q1 + 1);
  if (d == std::string::npos || q1 == std::string::npos || q2 == std::string::npos) {
    throw std::runtime_error(path + ": no descr in header " + header);
  }
  a.descr = header.substr(q1 + 1, q2 - q1 - 1);
  if (header.find("'fortran_order': False") == std::string::npos) {
    throw std::runtime_error(path + ": only C-order arrays are supported");
  }
  const size_t s = header.find("'shape':");
  const size_t p1 = header.find('(', s);
  const size_t p2 = header.find(')', p1);
  if (s == std::string::npos || p1 == std::string::npos || p2 == std::string::npos) {
    throw std::runtime_error(path + ": no shape in header " + header);
  }
  const std::string dims = header.substr(p1 + 1, p2 - p1 - 1);
  for (size_t i = 0; i < dims.size();) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    size_t used = 0;
    a.shape.push_back(std::stoll(dims.substr(i), &used));
    i += used;
  }
  const size_t isz = item_size(a.descr);
  if (isz == 0) throw std::runtime_error(path + ": unsupported dtype " + a.descr);
  a.data.resize(static_cast<size_t>(a.numel()) * isz);
  if (!f.read(a.data.data(), static_cast<std::streamsize>(a.data.size()))) {
    throw std::runtime_error(path + ": truncated data");
  }
  return a;
}

inline void write(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
                  const void* data, size_t nbytes) {
  std::string shape_str = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_str += std::to_string(shape[i]) + ", ";
  if (shape.size() > 1) shape_str.resize(shape_str.size() - 2);  // "(2, 3)"; "(5, )" stays a tuple
  shape_str += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_str + ", }";
  // Version 1.0: 10 bytes of preamble; header padded with spaces so that the data is 64-byte aligned.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write " + path);
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                 static_cast<unsigned char>(header.size() & 0xff),
                                 static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(pre), 10);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(nbytes));
  if (!f) throw std::runtime_error("error writing " + path);
}

}  // namespace npy
