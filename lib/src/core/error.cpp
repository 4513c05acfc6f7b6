// ember::ErrorKind names.
#include "ember/core/error.h"

namespace ember {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kConfig:
      return "config";
    case ErrorKind::kData:
      return "data";
    case ErrorKind::kCheckpoint:
      return "checkpoint";
    case ErrorKind::kDistributed:
      return "distributed";
    case ErrorKind::kDiverged:
      return "diverged";
    case ErrorKind::kGeneral:
      break;
  }
  return "general";
}

}  // namespace ember
