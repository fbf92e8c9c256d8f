/* Compiled as C (not C++) so that recorder_c.h stays a valid C header. */
#include "crashreplay/capture/recorder_c.h"

int crashreplay_recorder_c_header_check(void) {
  cr_recorder_options o;
  cr_recorder_options_init(&o);
  return cr_recorder_abi_version() == CR_RECORDER_ABI_VERSION && o.max_snapshots > 0 && o.arm_coredumps == 0;
}
