//! The burn backends this crate runs on, and the device choice that crates above it make without naming
//! burn types.
//!
//! [`DeviceKind`] parses `cpu`, `cuda` and `cuda:N`. A build without the `cuda` feature refuses a CUDA
//! device in one error; a CUDA build checks the driver ([`check_cuda`]) before burn-cuda touches it, since
//! cudarc loads `libcuda` on first use and panics when it is missing.

use crate::error::{Error, Result};

/// The CPU backend: burn-ndarray in f32.
pub type Cpu = burn_ndarray::NdArray<f32>;
/// The CPU backend with automatic differentiation, for training.
pub type CpuAutodiff = burn_autodiff::Autodiff<Cpu>;
/// The CUDA backend (with kernel fusion), in f32.
#[cfg(feature = "cuda")]
pub type Cuda = burn_cuda::Cuda<f32, i32>;
/// The CUDA backend with automatic differentiation.
#[cfg(feature = "cuda")]
pub type CudaAutodiff = burn_autodiff::Autodiff<Cuda>;

/// Where a policy runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU (burn-ndarray).
    #[default]
    Cpu,
    /// An NVIDIA GPU by index; needs the `cuda` feature and a driver.
    Cuda(usize),
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl std::str::FromStr for DeviceKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|i| i.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| Error::Device(s.to_string(), "expected cpu, cuda or cuda:N".to_string())),
        }
    }
}

/// The element type an inference policy keeps its weight matrices in.
///
/// `Bf16` keeps every projection and the embedding in bf16 on the device (half the memory of f32, and the
/// dtype checkpoints ship in): each product multiplies bf16 operands, which burn-cuda's matmul accumulates in
/// f32, and returns f32, so norms, RoPE, softmax and the logits stay f32. CUDA only: the CPU kernels are
/// f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InferenceDtype {
    /// Every weight in f32.
    #[default]
    F32,
    /// Weight matrices in bf16, everything else f32.
    Bf16,
}

impl std::fmt::Display for InferenceDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        })
    }
}

impl std::str::FromStr for InferenceDtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            _ => Err(Error::config(
                "dtype",
                format!("{s:?} is not an inference dtype: expected f32 or bf16"),
            )),
        }
    }
}

impl InferenceDtype {
    /// Checks that `device` can run this dtype: bf16 needs CUDA.
    pub fn check_on(self, device: DeviceKind) -> Result<()> {
        match (self, device) {
            (Self::Bf16, DeviceKind::Cpu) => Err(Error::Device(
                device.to_string(),
                "bf16 weights for inference need a CUDA device (the CPU kernels are f32)".to_string(),
            )),
            _ => Ok(()),
        }
    }
}

/// Why a build without the `cuda` feature refuses a CUDA device.
#[cfg(not(feature = "cuda"))]
pub(crate) const NO_CUDA: &str = "this build has no `cuda` feature (build with `--features cuda`)";

impl DeviceKind {
    /// Checks that this device can be used by this build on this machine: always for the CPU; for CUDA, the
    /// `cuda` feature, a loadable driver and a device of that index. One error naming the device otherwise.
    pub fn check(self) -> Result<()> {
        match self {
            Self::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Self::Cuda(i) => check_cuda(i),
            #[cfg(not(feature = "cuda"))]
            Self::Cuda(_) => Err(Error::Device(self.to_string(), NO_CUDA.to_string())),
        }
    }
}

/// The names the NVIDIA driver library goes by (cudarc tries these among others).
#[cfg(feature = "cuda")]
const LIBCUDA: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// Checks that the NVIDIA driver loads and initialises and that CUDA device `index` exists, without
/// cudarc: its dynamic loading panics when `libcuda` is missing.
#[cfg(feature = "cuda")]
#[expect(
    unsafe_code,
    reason = "loads the NVIDIA driver library and calls two of its C functions"
)]
pub fn check_cuda(index: usize) -> Result<()> {
    let device = DeviceKind::Cuda(index).to_string();
    let fail = |why: String| Err(Error::Device(device.clone(), why));
    // SAFETY: loading the driver library runs its initialisers, as cudarc's own loading would.
    let Some(lib) = LIBCUDA
        .iter()
        .find_map(|&name| unsafe { libloading::Library::new(name) }.ok())
    else {
        return fail(format!(
            "the NVIDIA driver library ({}) cannot be loaded: no driver is installed here, or it is not on \
             the loader's path (LD_LIBRARY_PATH)",
            LIBCUDA.join(" or ")
        ));
    };
    type CuInit = unsafe extern "C" fn(u32) -> i32;
    type CuDeviceGetCount = unsafe extern "C" fn(*mut i32) -> i32;
    // SAFETY: both symbols have these C signatures in every CUDA driver API version (cuda.h), and they are
    // called while `lib` is loaded.
    unsafe {
        let (Ok(init), Ok(count_fn)) = (
            lib.get::<CuInit>(b"cuInit\0"),
            lib.get::<CuDeviceGetCount>(b"cuDeviceGetCount\0"),
        ) else {
            return fail("the NVIDIA driver library lacks cuInit or cuDeviceGetCount".to_string());
        };
        let code = init(0);
        if code != 0 {
            return fail(format!(
                "the NVIDIA driver did not initialise (cuInit returned CUDA error {code}; 100 means no device)"
            ));
        }
        let mut count = 0i32;
        let code = count_fn(&mut count);
        if code != 0 {
            return fail(format!("counting CUDA devices failed (CUDA error {code})"));
        }
        if index >= usize::try_from(count).unwrap_or(0) {
            return fail(format!("this machine has {count} CUDA device(s)"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
