#include "trainer/disk_space.hpp"

#include "base/host_resources.hpp"
#include "kernels/dtype.hpp"

namespace rp {

uint64_t checkpoint_bytes(const ModelLayout& layout, const TrainSpec& spec) {
  uint64_t n = 0;  // frozen groups (a LoRA base) are neither saved nor in the optimizer state
  for (const auto& g : layout.groups)
    if (!g.frozen) n += uint64_t(g.numel);
  const DType save = parse_dtype(spec.save_dtype);
  uint64_t per_param = dtype_size(save);         // model.safetensors
  per_param += 8 + (spec.adam.amsgrad ? 4 : 0);  // m, v, vmax
  per_param += save == DType::f32 ? 0 : 4;       // fp32 master in optimizer.bin
  per_param += spec.async ? 4 : 0;               // low-precision copy (f32 on the CPU backend)
  return n * per_param + (uint64_t(64) << 20);
}

void require_disk_space(const std::string& dir, uint64_t need, const std::string& what) {
  require_free_disk(dir, need, what,
                    "free some space or set output_dir to another disk (finished checkpoints are kept)");
}

}  // namespace rp
