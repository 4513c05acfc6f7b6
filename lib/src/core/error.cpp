// ember::ErrorKind names.
#include "ember/core/error.h"
#include "ember/core/enum_names.h"

namespace ember {

namespace {
constexpr core::EnumNames<ErrorKind, 6> kErrorKindNames{"error kind",
                                                        {{{ErrorKind::kGeneral, "general"},
                                                          {ErrorKind::kConfig, "config"},
                                                          {ErrorKind::kData, "data"},
                                                          {ErrorKind::kCheckpoint, "checkpoint"},
                                                          {ErrorKind::kDistributed, "distributed"},
                                                          {ErrorKind::kDiverged, "diverged"}}}};
}  // namespace

const char* to_string(ErrorKind kind) {
  return kErrorKindNames.name(kind);
}

}  // namespace ember
