// Image file sniffing, by content as OpenCV picks its decoder (never by the file name): the
// format; the size a JPEG, PNG or BMP declares, read where its decoder reads it, so that no
// other content and no larger image reaches a decoder; whether such a file is whole (its end
// marker, last chunk or declared size is there), since the decoders accept some truncated files.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
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

bool is_jpeg(const uint8_t* p, size_t n) {
  return n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF;
}
bool is_png(const uint8_t* p, size_t n) {
  return n >= 8 && std::memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0;
}
bool is_bmp(const uint8_t* p, size_t n) {
  return n >= 2 && p[0] == 'B' && p[1] == 'M';
}
/// Whether `magic` (m bytes) is at byte `at`.
bool has(const uint8_t* p, size_t n, const char* magic, size_t m, size_t at = 0) {
  return n >= at + m && std::memcmp(p + at, magic, m) == 0;
}

/// A frame header: SOF0-15 (FF C0-CF) but DHT (C4), JPG (C8) and DAC (CC).
bool is_sof(uint8_t marker) {
  return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

/// The frame size as libjpeg (jdmarker.c) finds it: bytes up to the next FF
/// are skipped (with a warning), and so are fill FFs and FF 00; the size is
/// that of the one frame header before the first scan. libjpeg fails on a
/// second frame header (before or after the scan), so no other size is decoded.
std::string jpeg_size(const uint8_t* p, size_t n, int64_t* width, int64_t* height) {
  bool found = false;
  size_t i = 2;  // after SOI
  while (true) {
    while (i < n && p[i] != 0xFF) ++i;
    while (i < n && p[i] == 0xFF) ++i;
    if (i >= n) break;
    const size_t at = i - 1;  // the FF before the marker byte
    const uint8_t marker = p[i++];
    if (marker == 0x00) continue;                 // FF 00 is no marker: skipped as stray bytes
    if (marker == 0xDA || marker == 0xD9) break;  // SOS: the frame header is before it; EOI
    // Markers without a length: TEM, SOI, RST0-7.
    if (marker == 0x01 || marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (i + 2 > n) break;
    const size_t length = (size_t{p[i]} << 8) | p[i + 1];  // counts its own two bytes
    if (length < 2)
      return fmt::format("corrupt JPEG: segment FF {:02X} at byte {} has length {}", marker, at, length);
    if (is_sof(marker)) {
      if (found) return fmt::format("corrupt JPEG: a second frame header (FF {:02X}) at byte {}", marker, at);
      if (length < 8 || i + 7 > n)
        return fmt::format("corrupt JPEG: the frame header (FF {:02X}) at byte {} is cut short", marker, at);
      *height = (int64_t{p[i + 3]} << 8) | p[i + 4];  // after length (2) and precision (1)
      *width = (int64_t{p[i + 5]} << 8) | p[i + 6];
      found = true;
    }
    i += length;
  }
  return found ? "" : "corrupt JPEG: no frame header (SOF marker) before the first scan";
}

/// The size in IHDR, which the PNG specification puts first (libpng would
/// skip an unknown ancillary chunk before it).
std::string png_size(const uint8_t* p, size_t n, int64_t* width, int64_t* height) {
  if (n < 24 || std::memcmp(p + 12, "IHDR", 4) != 0)
    return "corrupt PNG: the first chunk is not IHDR (where PNG declares the image size)";
  *width = be32(p + 16);
  *height = be32(p + 20);
  return "";
}

/// The size as OpenCV's BMP decoder (grfmt_bmp.cpp) reads it. An info header
/// (its size at byte 14) of 12 bytes (OS/2 1.x) has 16-bit unsigned width and
/// height at bytes 18 and 20; one of 36 bytes or more (Windows 3.x and later,
/// OS/2 2.x) 32-bit signed ones at 18 and 22, a negative height meaning rows
/// stored top-down. OpenCV reads no other header size.
std::string bmp_size(const uint8_t* p, size_t n, int64_t* width, int64_t* height) {
  const std::string truncated = "truncated BMP: the info header is cut short";
  if (n < 18) return truncated;
  const auto header = static_cast<int32_t>(le32(p + 14));
  if (header == 12) {
    if (n < 22) return truncated;
    *width = p[18] | (int64_t{p[19]} << 8);
    *height = p[20] | (int64_t{p[21]} << 8);
    return "";
  }
  if (header < 36)
    return fmt::format(
        "unsupported BMP: an info header of {} bytes (OpenCV reads those of 12 bytes, or of 36 and more)",
        header);
  if (n < 26) return truncated;
  *width = static_cast<int32_t>(le32(p + 18));  // negative: OpenCV refuses it, and so does bound_refusal
  const auto h = static_cast<int32_t>(le32(p + 22));
  *height = h < 0 ? -int64_t{h} : h;
  return "";
}

}  // namespace

std::string content_format(const uint8_t* p, size_t n) {
  // The first three as OpenCV's imdecode picks a decoder: the first in its
  // list (BMP, HDR, JPEG, WebP, Sun raster, PNM, PAM, PFM, TIFF, PNG, JPEG
  // 2000, OpenEXR, GDAL's) whose signature the first bytes match. No decoder
  // before JPEG or PNG claims their signatures.
  if (is_bmp(p, n)) return "BMP";
  if (is_jpeg(p, n)) return "JPEG";
  if (is_png(p, n)) return "PNG";
  // Other formats OpenCV or common tools read, named for the error message.
  if (has(p, n, "II*\0", 4) || has(p, n, "MM\0*", 4) || has(p, n, "II+\0", 4) || has(p, n, "MM\0+", 4))
    return "TIFF";
  if (has(p, n, "RIFF", 4) && has(p, n, "WEBP", 4, 8)) return "WebP";
  if (has(p, n, "\x59\xA6\x6A\x95", 4)) return "Sun raster";
  if (n >= 3 && p[0] == 'P' && p[1] >= '1' && p[1] <= '6' && std::isspace(p[2])) return "PNM";
  if (has(p, n, "P7", 2)) return "PAM";
  if (has(p, n, "Pf", 2) || has(p, n, "PF", 2)) return "PFM";
  if (has(p, n, "#?RADIANCE", 10) || has(p, n, "#?RGBE", 6)) return "Radiance HDR";
  if (has(p, n, "\x76\x2F\x31\x01", 4)) return "OpenEXR";
  if (has(p, n, "\xFF\x4F\xFF\x51", 4) || has(p, n, "jP  \r\n\x87\n", 8, 4)) return "JPEG 2000";
  if (has(p, n, "GIF8", 4)) return "GIF";
  if (has(p, n, "ftyp", 4, 4)) return "HEIF/AVIF";
  if (has(p, n, "\xFF\x0A", 2) || has(p, n, "JXL ", 4, 4)) return "JPEG XL";
  if (has(p, n, "8BPS", 4)) return "PSD";
  if (has(p, n, "NITF", 4) || has(p, n, "NSIF", 4)) return "NITF";
  if (has(p, n, "DICM", 4, 128)) return "DICOM";
  return "";
}

std::string image_size_of(const uint8_t* p, size_t n, int64_t* width, int64_t* height) {
  if (is_bmp(p, n)) return bmp_size(p, n, width, height);
  if (is_jpeg(p, n)) return jpeg_size(p, n, width, height);
  if (is_png(p, n)) return png_size(p, n, width, height);
  return "not JPEG, PNG or BMP content";
}

std::string bound_refusal(const uint8_t* p, size_t n, int64_t max_pixels) {
  const std::string format = content_format(p, n);         // a name, for the messages
  if (!is_bmp(p, n) && !is_jpeg(p, n) && !is_png(p, n)) {  // as content_format tells them apart
    std::string first;
    for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) first += fmt::format(" {:02X}", p[i]);
    return fmt::format(
        "content is {}not JPEG, PNG or BMP (first bytes{}): Ember decodes only those formats, whose size it "
        "reads before decoding (OpenCV would decode others whatever size they declare); convert the file to "
        "PNG or JPEG, or remove it",
        format.empty() ? "" : format + ", ", first);
  }
  int64_t width = 0, height = 0;
  const std::string error = image_size_of(p, n, &width, &height);
  if (!error.empty()) return error;
  if (width < 1 || height < 1) return fmt::format("corrupt {}: declares {}x{} pixels", format, width, height);
  if (width > max_pixels || height > max_pixels || width > max_pixels / height)  // no overflow
    return fmt::format("declares {}x{} pixels, more than data.max_pixels={}: refused before decoding", width,
                       height, max_pixels);
  return "";
}

std::string truncation_of(const uint8_t* p, size_t n) {
  if (is_jpeg(p, n)) return jpeg_truncation(p, n);
  if (is_png(p, n)) return png_truncation(p, n);
  if (n >= 14 && is_bmp(p, n) && le32(p + 2) > n)
    return fmt::format("truncated BMP: {} of the {} bytes its header declares", n, le32(p + 2));
  return "";
}

}  // namespace ember::data::detail
