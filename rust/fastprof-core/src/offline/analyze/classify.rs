//! What an event is, for the breakdowns: its role in the TensorBoard
//! PyTorch-profiler plugin's step-time breakdown, and its kernel type in
//! HolisticTraceAnalysis's sense. Decided from `cat` and `name` only.

use crate::contract;

/// A host-side role (the device-side ones come from [`DeviceKind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum HostRole {
    /// Collectives launched from the host: `nccl:*`, `gloo:*` (the plugin's
    /// names) and `c10d::*` ops.
    Communication,
    /// `cuda_runtime`, `cuda_driver` and the other `*_runtime` categories.
    Runtime,
    /// torch's `enumerate(DataLoader)#...__next__` / `enumerate(DataPipe)#...`
    /// ops, fastprof's `loader.<name>.next` spans.
    DataLoader,
    /// `cpu_op`, `operator`, `user_annotation` (not `ProfilerStep#N`), `python`.
    CpuExec,
}

/// An activity on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceKind {
    Kernel,
    /// A kernel of a collective library (name contains `nccl`).
    CommKernel,
    Memcpy,
    Memset,
}

/// What an `X` event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Host(HostRole),
    Device(DeviceKind),
    /// `ProfilerStep#N`.
    ProfilerStep(i64),
    /// A fastprof `step` span (numbered later).
    FastprofStep,
    /// Not part of any breakdown (`python_function`, `gpu_user_annotation`,
    /// fastprof user spans, ...): the time they cover is Other unless
    /// something else covers it.
    Ignored,
}

/// Classify an `X` event. `fastprof` is true in fastprof segments and merged
/// traces, where a span named `step` is a training step.
pub(crate) fn classify(cat: &str, name: &str, fastprof: bool) -> Class {
    if let Some(n) = name.strip_prefix("ProfilerStep#") {
        return match n.parse() {
            Ok(n) => Class::ProfilerStep(n),
            Err(_) => Class::Ignored,
        };
    }
    let cat_is = |c: &str| cat.eq_ignore_ascii_case(c);
    if cat_is("kernel") {
        return Class::Device(if name.contains("nccl") {
            DeviceKind::CommKernel
        } else {
            DeviceKind::Kernel
        });
    }
    if cat_is("gpu_memcpy") || cat_is("memcpy") {
        return Class::Device(DeviceKind::Memcpy);
    }
    if cat_is("gpu_memset") || cat_is("memset") {
        return Class::Device(DeviceKind::Memset);
    }
    if cat_is("cuda_driver") || cat_is("runtime") || cat.to_ascii_lowercase().ends_with("_runtime")
    {
        return Class::Host(HostRole::Runtime);
    }
    let host_op = cat_is("cpu_op") || cat_is("operator") || cat_is("user_annotation");
    if host_op
        && ((name.starts_with("enumerate(DataLoader)#") && name.ends_with(".__next__"))
            || name.starts_with("enumerate(DataPipe)#"))
    {
        return Class::Host(HostRole::DataLoader);
    }
    if host_op || cat_is("python") {
        if ["nccl:", "gloo:", "c10d::"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            return Class::Host(HostRole::Communication);
        }
        return Class::Host(HostRole::CpuExec);
    }
    if fastprof {
        if name == contract::STEP_SPAN {
            return Class::FastprofStep;
        }
        if contract::is_loader_next(name) {
            return Class::Host(HostRole::DataLoader);
        }
    }
    Class::Ignored
}

/// HTA's kernel types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelType {
    Communication,
    Computation,
    Memory,
    Other,
}

/// HTA's rules: `^nccl.*Kernel` is communication; a name starting with
/// `Memcpy`, `Memset` or `dma` is memory; the rest is computation unless it
/// names a copy, a set or a sync.
pub(crate) fn kernel_type(kind: DeviceKind, name: &str) -> KernelType {
    if matches!(kind, DeviceKind::Memcpy | DeviceKind::Memset) {
        return KernelType::Memory;
    }
    if name.starts_with("nccl") && name.contains("Kernel") {
        return KernelType::Communication;
    }
    if ["Memcpy", "Memset", "dma"]
        .iter()
        .any(|p| name.starts_with(p))
    {
        return KernelType::Memory;
    }
    if name.contains("Memcpy") || name.contains("Memset") || name.contains("Sync") {
        return KernelType::Other;
    }
    KernelType::Computation
}

/// Substrings of kernel names that mark tensor-core kernels (the MMA
/// instruction shapes and the CUTLASS/cuDNN/cuBLAS families built on them).
const TENSOR_CORE_MARKS: &[&str] = &[
    "h884",
    "s884",
    "h1688",
    "s1688",
    "c1688",
    "i8816",
    "16816",
    "hmma",
    "imma",
    "wgmma",
    "tensorop",
    "xmma_",
    "_tensor_core",
    "dgrad_1x1_stride_2x2",
    "first_layer_wgrad_kernel",
    "conv1x1",
    "conv2d_c1_k1",
    "direct_group",
];

/// Whether a kernel (by name) runs on tensor cores.
pub(crate) fn uses_tensor_cores(name: &str) -> bool {
    TENSOR_CORE_MARKS.iter().any(|m| name.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        use Class::*;
        assert_eq!(classify("cpu_op", "ProfilerStep#7", false), ProfilerStep(7));
        assert_eq!(
            classify("kernel", "ncclDevKernel_AllReduce_Sum_f32", false),
            Device(DeviceKind::CommKernel)
        );
        assert_eq!(
            classify("Kernel", "gemm", false),
            Device(DeviceKind::Kernel)
        );
        assert_eq!(
            classify("gpu_memcpy", "Memcpy HtoD", false),
            Device(DeviceKind::Memcpy)
        );
        assert_eq!(
            classify("cuda_driver", "cuLaunchKernel", false),
            Host(HostRole::Runtime)
        );
        assert_eq!(
            classify(
                "user_annotation",
                "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                false
            ),
            Host(HostRole::DataLoader)
        );
        assert_eq!(
            classify("cpu_op", "nccl:all_reduce", false),
            Host(HostRole::Communication)
        );
        assert_eq!(
            classify("cpu_op", "aten::mm", false),
            Host(HostRole::CpuExec)
        );
        assert_eq!(classify("python_function", "f", false), Ignored);
        assert_eq!(classify("", "step", true), FastprofStep);
        assert_eq!(classify("", "step", false), Ignored);
        assert_eq!(
            classify("", "loader.train.next", true),
            Host(HostRole::DataLoader)
        );
        assert_eq!(classify("", "loader.train.fetch", true), Ignored);
    }

    #[test]
    fn kernel_types_and_tensor_cores() {
        use KernelType::*;
        let k = DeviceKind::Kernel;
        assert_eq!(
            kernel_type(DeviceKind::CommKernel, "ncclKernel_AllReduce"),
            Communication
        );
        assert_eq!(kernel_type(DeviceKind::Memset, "Memset (Device)"), Memory);
        assert_eq!(kernel_type(k, "void gemm"), Computation);
        assert_eq!(kernel_type(k, "cudaStreamSync"), Other);
        assert!(uses_tensor_cores("sm80_xmma_gemm_f16f16_f16f32"));
        assert!(uses_tensor_cores("volta_h884gemm_64x64"));
        assert!(!uses_tensor_cores("vectorized_elementwise_kernel"));
    }
}
