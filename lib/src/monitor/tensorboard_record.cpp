// TensorBoard events through the generated protobuf-lite classes; CRC-32C
// through Boost.CRC (header-only). Compiled without LibTorch's include
// directories (see tensorboard_record.h).
#include "monitor/tensorboard_record.h"

#include <boost/crc.hpp>

#include "tensorboard_event.pb.h"

namespace ember::monitor::detail {

uint32_t crc32c(const void* data, size_t size) {
  // CRC-32C: polynomial 0x1EDC6F41, initial value and final XOR all ones,
  // input and output reflected.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {
void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
}  // namespace

void append_record(std::string& out, const std::string& payload) {
  std::string length;
  append_le(length, payload.size(), 8);
  out += length;
  append_le(out, masked_crc32c(length.data(), length.size()), 4);
  out += payload;
  append_le(out, masked_crc32c(payload.data(), payload.size()), 4);
}

std::string file_version_event(const std::string& version, double wall_time) {
  ember::tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_file_version(version);
  return event.SerializeAsString();
}

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  ember::tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  auto* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(value);
  return event.SerializeAsString();
}

std::string histogram_event(const std::string& tag, const Histogram& histogram, int64_t step,
                            double wall_time) {
  ember::tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  auto* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* h = v->mutable_histo();
  h->set_min(histogram.min);
  h->set_max(histogram.max);
  h->set_num(histogram.num);
  h->set_sum(histogram.sum);
  h->set_sum_squares(histogram.sum_squares);
  h->mutable_bucket_limit()->Add(histogram.bucket_limit.begin(), histogram.bucket_limit.end());
  h->mutable_bucket()->Add(histogram.bucket.begin(), histogram.bucket.end());
  return event.SerializeAsString();
}

}  // namespace ember::monitor::detail
