// PyTorch binding of the fused sampler update in denoise_step_kernel.cu (built by cuda_ext/cuda_build.py).

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

#include <optional>

cudaError_t worldloop_denoise_step(int dtype_code, const void* x, const void* v_cond, const void* v_uncond,
                                   const void* v_first, const float* dt, void* out, int64_t numel,
                                   int64_t per_sample, float guidance, bool has_clamp, float lo, float hi,
                                   cudaStream_t stream);

namespace {

void check_like(const torch::Tensor& t, const torch::Tensor& x, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous(), "denoise_step (cuda): ", name, " must be a contiguous CUDA tensor");
  TORCH_CHECK(t.sizes() == x.sizes() && t.scalar_type() == x.scalar_type(), "denoise_step (cuda): ", name,
              " must match x in shape and dtype");
}

torch::Tensor denoise_step(const torch::Tensor& x, const torch::Tensor& v_cond,
                           const std::optional<torch::Tensor>& v_uncond,
                           const std::optional<torch::Tensor>& v_first, const torch::Tensor& dt, double guidance,
                           bool has_clamp, double lo, double hi) {
  check_like(x, x, "x");
  check_like(v_cond, x, "v_cond");
  if (v_uncond) check_like(*v_uncond, x, "v_uncond");
  if (v_first) check_like(*v_first, x, "v_first");
  TORCH_CHECK(dt.is_cuda() && dt.scalar_type() == torch::kFloat32 && dt.numel() == x.size(0),
              "denoise_step (cuda): dt must be a float32 CUDA tensor with one value per sample");
  int dtype_code;
  switch (x.scalar_type()) {
    case torch::kFloat32: dtype_code = 0; break;
    case torch::kFloat16: dtype_code = 1; break;
    case torch::kBFloat16: dtype_code = 2; break;
    default: TORCH_CHECK(false, "denoise_step (cuda): x must be float32, float16 or bfloat16");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  auto out = torch::empty_like(x);
  const auto err = worldloop_denoise_step(
      dtype_code, x.data_ptr(), v_cond.data_ptr(), v_uncond ? v_uncond->data_ptr() : nullptr,
      v_first ? v_first->data_ptr() : nullptr, dt.data_ptr<float>(), out.data_ptr(), x.numel(),
      x.numel() / x.size(0), static_cast<float>(guidance), has_clamp, static_cast<float>(lo),
      static_cast<float>(hi), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "denoise_step (cuda): kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("denoise_step", &denoise_step, "Fused CFG + Euler/Heun + clamp sampler update (CUDA)");
}
