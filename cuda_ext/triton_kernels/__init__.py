"""Triton kernels behind the cuda_ext dispatch functions. Importing these modules imports Triton."""
