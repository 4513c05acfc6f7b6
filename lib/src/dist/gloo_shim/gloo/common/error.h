#pragma once
// Empty: ProcessGroupGloo.hpp includes it but uses nothing from it (see README.md).
