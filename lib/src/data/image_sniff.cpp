// Image file sniffing: whether a JPEG, PNG or BMP file is whole (its end marker, last chunk or
// declared size is there), told apart by content; the decoders accept some truncated files.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "data/image_folder_internal.h"

namespace ember::data::detail {
namespace {

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
uint32_t le32(const uint8_t* p) {
  return (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | p[0];
}

/// Walks the JPEG's segments to its end-of-image marker (FF D9). libjpeg
/// decodes a truncated file into a partial image padded with grey and only
/// warns, so the decoder's result alone does not show truncation. Bytes after
/// EOI (camera trailers) are allowed.
std::string jpeg_truncation(const uint8_t* p, size_t n) {
  const std::string truncated = "truncated JPEG: the end-of-image marker FF D9 is missing";
  size_t i = 2;  // after SOI
  while (true) {
    while (i < n && p[i] != 0xFF) ++i;  // stray bytes between segments (libjpeg skips them)
    while (i < n && p[i] == 0xFF) ++i;  // fill bytes
    if (i >= n) return truncated;
    const uint8_t marker = p[i++];
    if (marker == 0xD9) return "";  // EOI
    // Markers without a length: TEM, SOI, RST0-7 (and 00, which is no marker outside a scan).
    if (marker == 0x00 || marker == 0x01 || marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (i + 2 > n) return truncated;
    const size_t length = (size_t{p[i]} << 8) | p[i + 1];  // counts its own two bytes
    if (length < 2)
      return fmt::format("corrupt JPEG: segment FF {:02X} at byte {} has length {}", marker, i - 2, length);
    i += length;
    if (i > n) return truncated;
    if (marker != 0xDA) continue;
    // After SOS: entropy-coded data up to the next marker; FF 00 is a stuffed
    // FF byte and FF D0-D7 restart markers belong to the scan.
    while (true) {
      const void* ff = i < n ? std::memchr(p + i, 0xFF, n - i) : nullptr;
      if (ff == nullptr) return truncated;
      i = static_cast<size_t>(static_cast<const uint8_t*>(ff) - p);
      size_t j = i + 1;
      while (j < n && p[j] == 0xFF) ++j;
      if (j >= n) return truncated;
      if (p[j] == 0x00 || (p[j] >= 0xD0 && p[j] <= 0xD7)) {
        i = j + 1;
        continue;
      }
      i = j - 1;  // the FF before the marker byte
      break;
    }
  }
}

/// Walks the PNG's chunks to IEND (length, type, data, CRC each).
std::string png_truncation(const uint8_t* p, size_t n) {
  size_t i = 8;  // after the signature
  while (true) {
    if (i + 8 > n) return "truncated PNG: the IEND chunk is missing";
    if (std::memcmp(p + i + 4, "IEND", 4) == 0) return "";
    i += 12 + size_t{be32(p + i)};
    if (i > n) return "truncated PNG: the IEND chunk is missing";
  }
}

/// The frame size in a JPEG's first SOF segment (any SOFn: FF C0-CF but C4
/// DHT, C8 JPG, CC DAC).
bool jpeg_size(const uint8_t* p, size_t n, int64_t* width, int64_t* height) {
  size_t i = 2;
  while (i + 4 <= n) {
    if (p[i] != 0xFF) return false;
    while (i < n && p[i] == 0xFF) ++i;
    if (i + 3 > n) return false;
    const uint8_t marker = p[i++];
    if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (marker == 0xD9 || marker == 0xDA) return false;  // no frame header before the scan
    const size_t length = (size_t{p[i]} << 8) | p[i + 1];
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
      if (i + 7 > n) return false;  // length, precision, height, width
      *height = (int64_t{p[i + 3]} << 8) | p[i + 4];
      *width = (int64_t{p[i + 5]} << 8) | p[i + 6];
      return true;
    }
    if (length < 2) return false;
    i += length;
  }
  return false;
}

}  // namespace

bool image_size_of(const uint8_t* p, size_t n, int64_t* width, int64_t* height) {
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return jpeg_size(p, n, width, height);
  if (n >= 24 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0 && std::memcmp(p + 12, "IHDR", 4) == 0) {
    *width = be32(p + 16);
    *height = be32(p + 20);
    return true;
  }
  if (n >= 26 && p[0] == 'B' && p[1] == 'M') {
    const auto w = static_cast<int32_t>(le32(p + 18)), h = static_cast<int32_t>(le32(p + 22));
    *width = w < 0 ? -int64_t{w} : w;  // negative height: stored top-down
    *height = h < 0 ? -int64_t{h} : h;
    return true;
  }
  return false;
}

std::string truncation_of(const uint8_t* p, size_t n) {
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return jpeg_truncation(p, n);
  if (n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) return png_truncation(p, n);
  if (n >= 14 && p[0] == 'B' && p[1] == 'M' && le32(p + 2) > n)
    return fmt::format("truncated BMP: {} of the {} bytes its header declares", n, le32(p + 2));
  return "";
}

}  // namespace ember::data::detail
