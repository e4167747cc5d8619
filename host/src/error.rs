//! Errors of the host API. Every user mistake is an `InvalidArgument` that names the argument, the
//! value given and what is allowed; nothing panics on user input.

use cudarc::driver::DriverError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no CUDA driver: libcuda could not be loaded (install an NVIDIA driver to run on a GPU)"
    )]
    NoDriver,
    #[error("no CUDA device {ordinal}: {detail}")]
    NoDevice { ordinal: usize, detail: String },
    #[error(
        "device {ordinal} ({name}) has compute capability {major}.{minor}, but the kernels were built for {arch}, which {requirement}"
    )]
    UnsupportedDevice {
        ordinal: usize,
        name: String,
        major: i32,
        minor: i32,
        arch: &'static str,
        /// What `arch` needs, e.g. "needs 9.0 or newer".
        requirement: String,
    },
    #[error("the kernel module ({arch} PTX) failed to load on device {ordinal}: {detail}")]
    ModuleLoad {
        ordinal: usize,
        arch: &'static str,
        detail: String,
    },
    #[error(
        "out of device memory: asked for {requested} bytes for {what}, {free} of {total} bytes free"
    )]
    OutOfMemory {
        what: &'static str,
        requested: usize,
        free: usize,
        total: usize,
    },
    #[error("invalid argument `{name}`: got {value}; {allowed}")]
    InvalidArgument {
        name: &'static str,
        value: String,
        allowed: String,
    },
    #[error("CUDA error in {context}: {source}")]
    Cuda {
        context: String,
        source: DriverError,
    },
    #[error("{0}")]
    File(String),
}

impl Error {
    /// An [`Error::InvalidArgument`]: the argument `name`, the `value` given and what is `allowed`.
    pub fn invalid(
        name: &'static str,
        value: impl std::fmt::Display,
        allowed: impl Into<String>,
    ) -> Self {
        Error::InvalidArgument {
            name,
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// Attaches what was being done to a driver error.
pub(crate) trait CudaContextExt<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> CudaContextExt<T> for std::result::Result<T, DriverError> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Cuda {
            context: context(),
            source,
        })
    }
}
