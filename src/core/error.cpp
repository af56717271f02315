#include "core/error.hpp"

#include <exception>
#include <new>

namespace cake {

namespace {
thread_local std::string last_error;

void set_last_error(std::string message) { last_error = std::move(message); }
}  // namespace

cakeResult_t guard(void (*body)(void*), void* context) {
  try {
    body(context);
    return cakeSuccess;
  } catch (Error const& e) {
    set_last_error(e.what());
    return e.code();
  } catch (std::bad_alloc const&) {
    set_last_error("out of host memory");
    return cakeInternalError;
  } catch (std::exception const& e) {
    set_last_error(concat("internal error: ", e.what()));
    return cakeInternalError;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return cakeInternalError;
  }
}

}  // namespace cake

extern "C" const char* cakeGetLastError(void) { return cake::last_error.c_str(); }

extern "C" const char* cakeGetErrorString(cakeResult_t result) {
  switch (result) {
    case cakeSuccess: return "cakeSuccess";
    case cakeInvalidArgument: return "cakeInvalidArgument";
    case cakeNotSupported: return "cakeNotSupported";
    case cakeInsufficientWorkspace: return "cakeInsufficientWorkspace";
    case cakeCudaError: return "cakeCudaError";
    case cakeInternalError: return "cakeInternalError";
    case cakeNotImplemented: return "cakeNotImplemented";
  }
  return "unknown cakeResult_t";
}
