// XXH3's default 192-byte secret, as libxxhash defines it (internal).
#pragma once

namespace crashreplay::capture {

const unsigned char* Xxh3DefaultSecret();

}  // namespace crashreplay::capture
