//! The burn backends this crate runs on, and the device choice that crates above it make without naming
//! burn types.

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
