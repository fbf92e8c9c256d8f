// Status helpers shared by every crashreplay library.
//
// The project's one error model is absl::Status / absl::StatusOr<T> across
// library boundaries; the status code tells the kind of failure:
//   DataLoss           corruption: checksum mismatch, torn or malformed record
//   InvalidArgument    a caller's or user's input is wrong (bad flag, bad config)
//   NotFound           a named file, tensor, step or toggle does not exist
//   FailedPrecondition the operation cannot run in the present state
//   ResourceExhausted  a limit was hit (size caps, memory budgets)
//   Unimplemented      a valid input this version does not support
//   Internal           a broken internal invariant that is not worth aborting for
// Messages say what was wrong and where (file, offset, tensor, step).
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CR_CONCAT_INNER_(a, b) a##b
#define CR_CONCAT_(a, b) CR_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` yields a non-OK status.
#define CR_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status cr_status_ = (expr);      \
    if (!cr_status_.ok()) return cr_status_; \
  } while (0)

// `CR_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr, or
// returns its error.
#define CR_ASSIGN_OR_RETURN(lhs, expr) CR_ASSIGN_OR_RETURN_IMPL_(CR_CONCAT_(cr_statusor_, __LINE__), lhs, expr)
#define CR_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()
