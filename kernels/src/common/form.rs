//! [`KernelForm`], which calls a tensor-core kernel (FA2-TC, FA3; forward or backward) serves,
//! and the macros that read it from a kernel-list entry. It lives beside the families that
//! compile it rather than in `registry`, so their configs name it without importing the list,
//! which imports them.

/// Which calls a kernel of the tensor-core families serves, forward or backward. Each form is
/// its own entry,
/// compiled from the same kernel body with the form's features as constants, so the dense
/// kernels carry none of the others' work: the window and soft-capping cost FA2-TC up to 11% and
/// FA3 up to 8% when they were runtime options of every kernel (call 20, docs/perf).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelForm {
    /// One length per batch, the causal mask or none, no soft-capping.
    Dense,
    /// A packed batch of sequences of different lengths (`common::params::PackedSequences`;
    /// entry suffix `_varlen`), at each head dim's default tiling.
    Packed,
    /// A sliding window and/or logit soft-capping (`common::mask::KeyWindow`,
    /// `common::softcap`; entry suffix `_local`), at each head dim's default tiling.
    Local,
    /// Both: a packed batch with a window and/or soft-capping, each sequence's window aligned to
    /// its own bottom-right corner (entry suffix `_varlen_local`), at each head dim's default
    /// tiling.
    PackedLocal,
}

impl KernelForm {
    pub const ALL: [KernelForm; 4] = [
        KernelForm::Dense,
        KernelForm::Packed,
        KernelForm::Local,
        KernelForm::PackedLocal,
    ];

    /// The entry-name suffix.
    pub const fn suffix(self) -> &'static str {
        match self {
            KernelForm::Dense => "",
            KernelForm::Packed => "_varlen",
            KernelForm::Local => "_local",
            KernelForm::PackedLocal => "_varlen_local",
        }
    }

    /// The form of a call: packed or not, with a window or soft-capping or not.
    pub const fn of(packed: bool, local: bool) -> Self {
        match (packed, local) {
            (false, false) => KernelForm::Dense,
            (true, false) => KernelForm::Packed,
            (false, true) => KernelForm::Local,
            (true, true) => KernelForm::PackedLocal,
        }
    }

    /// Whether the kernel reads a packed batch's sequence offsets (`PackedSequences`).
    pub const fn is_packed(self) -> bool {
        matches!(self, KernelForm::Packed | KernelForm::PackedLocal)
    }

    /// Whether the kernel reads the window and soft-capping from its parameters (else it takes
    /// the causal mask or none, and no capping, as constants).
    pub const fn is_local(self) -> bool {
        matches!(self, KernelForm::Local | KernelForm::PackedLocal)
    }

    // Constructors named as the kernel lists spell the forms (`for_each_kernel!`).
    pub const fn dense() -> Self {
        KernelForm::Dense
    }
    pub const fn varlen() -> Self {
        KernelForm::Packed
    }
    pub const fn local() -> Self {
        KernelForm::Local
    }
    pub const fn varlen_local() -> Self {
        KernelForm::PackedLocal
    }
}

/// The [`KernelForm`] of a list entry: its last word (`varlen`, `local`, `varlen_local`; a
/// backward entry's `dense`), dense without one or on the persistent grid.
#[macro_export]
macro_rules! kernel_form {
    () => {
        $crate::common::form::KernelForm::Dense
    };
    (persistent) => {
        $crate::common::form::KernelForm::Dense
    };
    ($form:ident) => {
        $crate::common::form::KernelForm::$form()
    };
}

/// The entry-name suffix of a list entry's form (`KernelForm::suffix`, as a literal
/// for `concat!`).
#[macro_export]
macro_rules! kernel_form_suffix {
    () => {
        ""
    };
    (dense) => {
        ""
    };
    (varlen) => {
        "_varlen"
    };
    (local) => {
        "_local"
    };
    (varlen_local) => {
        "_varlen_local"
    };
}
