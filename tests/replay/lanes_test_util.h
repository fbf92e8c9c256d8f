// Eight std::threads standing in for the eight threads of a GPU row group
// (kernels/linear.h, LinearElementsLane): BarrierLanes::Sum exchanges the
// lanes' partial sums through shared slots in the xor pattern of the CUDA
// kernels' shuffles (1, 2, 4; own value first), so a CPU test runs the lane
// functions exactly as the device combines them.
#pragma once

#include <barrier>
#include <thread>
#include <vector>

namespace crashreplay::replay::testing {

struct BarrierLanes {
  std::barrier<>* bar;
  float* slots;
  int j;
  float Sum(float v) const {
    for (int m : {1, 2, 4}) {
      slots[j] = v;
      bar->arrive_and_wait();
      const float other = slots[j ^ m];
      bar->arrive_and_wait();
      v = v + other;
    }
    return v;
  }
};

// Runs body(j, lanes) on eight lane threads at once and joins them.
template <class Body>
void OnEightLanes(const Body& body) {
  std::barrier<> bar(8);
  float slots[8];
  std::vector<std::thread> lanes;
  for (int j = 0; j < 8; ++j) {
    lanes.emplace_back([&, j] { body(j, BarrierLanes{&bar, slots, j}); });
  }
  for (std::thread& t : lanes) t.join();
}

}  // namespace crashreplay::replay::testing
