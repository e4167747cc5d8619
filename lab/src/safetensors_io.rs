//! Q, K, V in and attention outputs out as safetensors files: everything `flash-attn run` does
//! that needs no GPU, kept here so it can be tested on any machine and so that a bad file is
//! reported before a GPU is even opened.
//!
//! Tensors are (batch, heads, seqlen, head_dim), row-major and little-endian: PyTorch SDPA's
//! layout, which is what `safetensors.torch.save_file({"q": q, "k": k, "v": v}, path)` writes for
//! contiguous tensors. A packed batch of sequences of different lengths ([`read_packed`]) is
//! flash-attn's varlen layout instead: Q (total_q, heads, head_dim), K and V (total_k, heads_kv,
//! head_dim), and the offsets `cu_seqlens_q`, `cu_seqlens_k` (1-D integers, batch + 1 each).
//! Nothing in a file's content makes these functions panic: every problem is an [`Error`] that
//! names the file, the tensor and what was expected.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use ndarray::{Array, Array2, Array3, Array4, Axis, Dimension};
use safetensors::tensor::{Dtype, SafeTensors, TensorView, View};

use flash_attn::attention::{Gradients, PackedBatch};
use flash_attn::dtype::{DType, Element};
use flash_attn::error::{Error, Result};
use flash_attn::with_element;

/// What the attention API calls Q, K and V, and the tensor names read when the caller gives none.
pub const INPUT_ROLES: [&str; 3] = ["q", "k", "v"];
/// The backward's inputs: Q, K, V and dO (the loss's gradient with respect to O, Q's shape).
pub const BACKWARD_INPUT_ROLES: [&str; 4] = ["q", "k", "v", "do"];
/// dQ, dK, dV as the backward writes them: each its input's dtype and shape.
pub const GRADIENT_NAMES: [&str; 3] = ["dq", "dk", "dv"];
/// O: Q's dtype and shape.
pub const OUTPUT_NAME: &str = "o";
/// L = m + ln ℓ, F32, (batch, heads, seqlen_q); −∞ for rows that see no key.
pub const LOGSUMEXP_NAME: &str = "lse";
/// FA1's running row maximum m, F32, (batch, heads, seqlen_q).
pub const ROW_MAX_NAME: &str = "row_max";
/// FA1's row sum ℓ of exp(s − m), F32, (batch, heads, seqlen_q).
pub const ROW_SUM_NAME: &str = "row_sum";

/// What a valid input's tensors look like, quoted in errors so users can fix their files.
const EXPECTED_LAYOUT: &str = "(batch, heads, seqlen, head_dim)";
/// A packed batch's Q, K and V, as flash-attn's varlen call takes them.
const PACKED_LAYOUT: &str = "(total tokens, heads, head_dim)";
/// The offsets' names read from a packed file when the caller gives none.
pub const PACKED_OFFSET_NAMES: [&str; 2] = ["cu_seqlens_q", "cu_seqlens_k"];
/// A KV-cache call's tensors: Q, the caches, and the keys and values to append.
pub const DECODE_INPUT_ROLES: [&str; 5] = ["q", "k_cache", "v_cache", "k_new", "v_new"];
/// Each sequence's cache length (1-D integers, batch), read when the caller gives no name.
pub const CACHE_SEQLENS_NAME: &str = "cache_seqlens";
/// The caches as a call that appended keys leaves them, written back under these names.
pub const CACHE_NAMES: [&str; 2] = ["k_cache", "v_cache"];

/// An [`Element`] that safetensors can store: its file dtype and its little-endian encoding.
pub trait SafetensorsElement: Element {
    const SAFETENSORS_DTYPE: Dtype;
    /// The values of a tensor's data bytes; a trailing partial element is dropped (the caller's
    /// shape check then reports the shortfall).
    fn decode(bytes: &[u8]) -> Vec<Self>;
    /// Appends `self`'s little-endian bytes.
    fn encode(self, bytes: &mut Vec<u8>);
}

/// The three element types share one encoding rule (`from_le_bytes` / `to_le_bytes`), and each has
/// its [`HostQkv`] variant.
macro_rules! safetensors_element {
    ($($rust:ty => $file:ident, $variant:ident),* $(,)?) => {$(
        impl SafetensorsElement for $rust {
            const SAFETENSORS_DTYPE: Dtype = Dtype::$file;
            fn decode(bytes: &[u8]) -> Vec<Self> {
                let (elements, _partial) = bytes.as_chunks::<{ size_of::<$rust>() }>();
                elements.iter().map(|e| <$rust>::from_le_bytes(*e)).collect()
            }
            fn encode(self, bytes: &mut Vec<u8>) {
                bytes.extend_from_slice(&self.to_le_bytes());
            }
        }

        impl From<Qkv<$rust>> for HostQkv {
            fn from(qkv: Qkv<$rust>) -> Self {
                HostQkv::$variant(qkv)
            }
        }
    )*};
}
safetensors_element!(f32 => F32, F32, f16 => F16, F16, bf16 => BF16, Bf16);

/// The [`DType`] a file dtype is read as, if it is one the kernels take.
fn supported_dtype(dtype: Dtype) -> Option<DType> {
    match dtype {
        Dtype::F32 => Some(DType::F32),
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::Bf16),
        _ => None,
    }
}

/// Q, K and V of one element type, each (batch, heads, seqlen, head_dim), and dO (Q's shape)
/// when read for the backward ([`read_backward_inputs`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Qkv<T> {
    pub q: Array4<T>,
    pub k: Array4<T>,
    pub v: Array4<T>,
    pub d_o: Option<Array4<T>>,
    /// A KV-cache call's new keys and values ([`read_decode`] with `append`).
    pub appended: Option<(Array4<T>, Array4<T>)>,
}

impl<T> Qkv<T> {
    /// The shapes of Q, K and V, in the form [`flash_attn::Problem::new`] checks.
    pub fn dims(&self) -> [[usize; 4]; 3] {
        [&self.q, &self.k, &self.v].map(|a| [a.dim().0, a.dim().1, a.dim().2, a.dim().3])
    }
}

/// Q, K and V as read from a file: the element type is only known at run time.
#[derive(Clone, Debug, PartialEq)]
pub enum HostQkv {
    F32(Qkv<f32>),
    F16(Qkv<f16>),
    Bf16(Qkv<bf16>),
}

impl HostQkv {
    pub fn dtype(&self) -> DType {
        match self {
            HostQkv::F32(_) => DType::F32,
            HostQkv::F16(_) => DType::F16,
            HostQkv::Bf16(_) => DType::Bf16,
        }
    }

    pub fn dims(&self) -> [[usize; 4]; 3] {
        match self {
            HostQkv::F32(qkv) => qkv.dims(),
            HostQkv::F16(qkv) => qkv.dims(),
            HostQkv::Bf16(qkv) => qkv.dims(),
        }
    }
}

/// Reads Q, K and V from the tensors `names` (in that order; [`INPUT_ROLES`] by default) of the
/// safetensors file at `path`, checking that each exists, is 4-D and is F32, F16 or BF16, and that
/// all three share one dtype. Whether their shapes agree is [`flash_attn::Problem::new`]'s to say.
pub fn read_qkv(path: &Path, names: [&str; 3]) -> Result<HostQkv> {
    let bytes = read_bytes(path)?;
    read_inputs(
        &deserialize(&bytes, path)?,
        path,
        &INPUT_ROLES,
        &names,
        false,
    )
}

/// A packed batch from the file at `path`: Q, K, V (the tensors `names`, each
/// (total, heads, head_dim) and F32, F16 or BF16, one dtype; for the backward a fourth name,
/// dO, of Q's shape and dtype), returned as logical (1, heads, total, head_dim) arrays, and the
/// offsets `offsets` (1-D I32, U32 or I64, checked by [`PackedBatch::new`]). Whether the shapes
/// and offsets agree is [`PackedBatch::problem`]'s to say.
pub fn read_packed(
    path: &Path,
    names: &[&str],
    offsets: [&str; 2],
) -> Result<(HostQkv, PackedBatch)> {
    let bytes = read_bytes(path)?;
    let file = deserialize(&bytes, path)?;
    let roles = &BACKWARD_INPUT_ROLES[..names.len().clamp(3, 4)];
    let qkv = read_inputs(&file, path, roles, names, true)?;
    let [q, k] = offsets.map(|name| read_offsets(&file, path, name));
    Ok((qkv, PackedBatch::new(&q?, &k?)?))
}

/// A 1-D tensor of offsets as u32.
fn read_offsets(file: &SafeTensors, path: &Path, name: &str) -> Result<Vec<u32>> {
    let role = if name == PACKED_OFFSET_NAMES[1] {
        PACKED_OFFSET_NAMES[1]
    } else {
        PACKED_OFFSET_NAMES[0]
    };
    let (_, values) = read_integers(file, path, name, role, 1, "a packed batch's offsets")?;
    Ok(values)
}

/// A tensor of `rank` dimensions of I32, U32 or I64 values, each in u32, with its shape; errors
/// name `role` (what the call calls it) and say what the tensor is for (`what`).
fn read_integers(
    file: &SafeTensors,
    path: &Path,
    name: &str,
    role: &'static str,
    rank: usize,
    what: &str,
) -> Result<(Vec<usize>, Vec<u32>)> {
    let view = file.tensor(name).map_err(|_| {
        Error::File(format!(
            "{} has no tensor named `{name}` ({what})",
            path.display()
        ))
    })?;
    let label = tensor_label(name, path);
    let bad = |found: String| Error::InvalidArgument {
        name: role,
        value: format!("{label} {found}"),
        allowed: format!("{rank}-D I32, U32 or I64 values, 0 ≤ each < 2^32 ({what})"),
    };
    if view.shape().len() != rank {
        return Err(bad(format!("with shape {:?}", view.shape())));
    }
    let data = view.data();
    let values: Vec<i64> = match view.dtype() {
        Dtype::I32 => data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
            .collect(),
        Dtype::U32 => data
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
            .collect(),
        Dtype::I64 => data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
        other => return Err(bad(format!("with dtype {other}"))),
    };
    if values.len() != view.shape().iter().product::<usize>() {
        return Err(bad(format!(
            "whose data does not fill its shape {:?}",
            view.shape()
        )));
    }
    let values = values
        .into_iter()
        .map(|x| u32::try_from(x).map_err(|_| bad(format!("holding {x}"))))
        .collect::<Result<Vec<u32>>>()?;
    Ok((view.shape().to_vec(), values))
}

/// A KV-cache call read from a file: Q (batch, heads, q_tokens, d), the caches (batch, heads_kv,
/// capacity, d), or (pages, heads_kv, page_size, d) with a block table, with any keys and values
/// to append (batch, heads_kv, new_tokens, d), all in `tensors` (the caches as K and V); the
/// lengths; the block table.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeFile {
    pub tensors: HostQkv,
    pub cache_seqlens: Vec<u32>,
    pub block_table: Option<Array2<u32>>,
}

/// Reads a KV-cache call from the file at `path`: Q and the caches (the tensors `names`), the
/// keys and values to append (`append`, if given), the lengths (`cache_seqlens`, 1-D integers)
/// and a paged cache's block table (`block_table`, 2-D integers, if given). The shapes agree or
/// not by the library's checks.
pub fn read_decode(
    path: &Path,
    names: [&str; 3],
    append: Option<[&str; 2]>,
    cache_seqlens: &str,
    block_table: Option<&str>,
) -> Result<DecodeFile> {
    let bytes = read_bytes(path)?;
    let file = deserialize(&bytes, path)?;
    let mut all: Vec<&str> = names.to_vec();
    all.extend(append.iter().flatten());
    let tensors = read_inputs(&file, path, &DECODE_INPUT_ROLES[..all.len()], &all, false)?;
    let (_, lengths) = read_integers(
        &file,
        path,
        cache_seqlens,
        "cache_seqlens",
        1,
        "each sequence's cache length",
    )?;
    let table = block_table
        .map(|name| {
            let (shape, pages) =
                read_integers(&file, path, name, "block_table", 2, "a paged cache's pages")?;
            Array2::from_shape_vec((shape[0], shape[1]), pages)
                .map_err(|e| Error::File(format!("{}: {e}", tensor_label(name, path))))
        })
        .transpose()?;
    Ok(DecodeFile {
        tensors,
        cache_seqlens: lengths,
        block_table: table,
    })
}

/// [`read_qkv`] plus dO, the fourth of `names` ([`BACKWARD_INPUT_ROLES`] by default), with the
/// same checks (4-D, Q's dtype); whether its shape is Q's is the backward's check to make.
pub fn read_backward_inputs(path: &Path, names: [&str; 4]) -> Result<HostQkv> {
    let bytes = read_bytes(path)?;
    read_inputs(
        &deserialize(&bytes, path)?,
        path,
        &BACKWARD_INPUT_ROLES,
        &names,
        false,
    )
}

/// The bytes of the file at `path` (the `SafeTensors` view borrows them).
fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::File(format!("cannot read {}: {e}", path.display())))
}

/// The safetensors file in `bytes`, read from `path`.
fn deserialize<'a>(bytes: &'a [u8], path: &Path) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes).map_err(|e| {
        Error::File(format!(
            "{} is not a valid safetensors file: {e}",
            path.display()
        ))
    })
}

/// The tensors `names` (playing `roles`: Q, K, V and optionally dO) of the file at `path`, 4-D,
/// or with `packed` 3-D in flash-attn's varlen layout.
fn read_inputs(
    file: &SafeTensors,
    path: &Path,
    roles: &[&'static str],
    names: &[&str],
    packed: bool,
) -> Result<HostQkv> {
    let inputs = roles
        .iter()
        .zip(names)
        .map(|(role, name)| InputTensor::find(file, path, role, name, packed))
        .collect::<Result<Vec<_>>>()?;
    let [q, ..] = &inputs[..] else {
        return Err(Error::File("no tensors asked for".into()));
    };
    for other in &inputs[1..] {
        if other.dtype != q.dtype {
            return Err(Error::InvalidArgument {
                name: other.role,
                value: format!("{} with dtype {}", other.label(), other.view.dtype()),
                allowed: format!(
                    "q, k, v (and do) must share one dtype, and q ({}) is {}",
                    q.label(),
                    q.view.dtype()
                ),
            });
        }
    }
    Ok(with_element!(q.dtype, T => HostQkv::from(decode_qkv::<T>(&inputs)?)))
}

/// One of Q, K, V found in a file, with a supported dtype and rank 4.
struct InputTensor<'a> {
    /// "q", "k" or "v": the argument name errors use, as [`flash_attn::Problem::new`]'s do.
    role: &'static str,
    name: &'a str,
    path: &'a Path,
    view: TensorView<'a>,
    dtype: DType,
    /// Logical (batch, heads, seqlen, head_dim); (1, heads, total, head_dim) when `packed`.
    dims: [usize; 4],
    /// Stored (total, heads, head_dim), flash-attn's varlen layout.
    packed: bool,
}

impl<'a> InputTensor<'a> {
    fn find(
        file: &SafeTensors<'a>,
        path: &'a Path,
        role: &'static str,
        name: &'a str,
        packed: bool,
    ) -> Result<Self> {
        let view = file.tensor(name).map_err(|_| {
            let mut present = file.names();
            present.sort_unstable();
            let present = if present.is_empty() {
                "none".to_string()
            } else {
                present.join(", ")
            };
            // Only worth saying when the caller renamed it.
            let role_note = if name == role {
                String::new()
            } else {
                format!(" (the name given for {role})")
            };
            Error::File(format!(
                "{} has no tensor named `{name}`{role_note}; its tensors are: {present}",
                path.display()
            ))
        })?;
        let label = || tensor_label(name, path);
        let dtype = supported_dtype(view.dtype()).ok_or_else(|| Error::InvalidArgument {
            name: role,
            value: format!("{} with dtype {}", label(), view.dtype()),
            allowed: "allowed: F32, F16, BF16 (one dtype for q, k and v)".into(),
        })?;
        let shape_error = |expected: String| Error::InvalidArgument {
            name: role,
            value: format!("{} with shape {:?}", label(), view.shape()),
            allowed: expected,
        };
        let dims = if packed {
            let [total, heads, head_dim] = <[usize; 3]>::try_from(view.shape()).map_err(|_| {
                shape_error(format!(
                    "expected 3 dimensions {PACKED_LAYOUT} in a packed batch, as flash-attn's \
                     varlen call takes them"
                ))
            })?;
            [1, heads, total, head_dim]
        } else {
            <[usize; 4]>::try_from(view.shape()).map_err(|_| {
                shape_error(format!(
                    "expected 4 dimensions {EXPECTED_LAYOUT}, as PyTorch SDPA takes them"
                ))
            })?
        };
        Ok(Self {
            role,
            name,
            path,
            view,
            dtype,
            dims,
            packed,
        })
    }

    fn label(&self) -> String {
        tensor_label(self.name, self.path)
    }

    fn decode<T: SafetensorsElement>(&self) -> Result<Array4<T>> {
        let values = T::decode(self.view.data());
        // A packed tensor is stored (total, heads, d): read as (1, total, heads, d), then its
        // axes swapped into the logical (1, heads, total, d).
        let [b, h, s, d] = self.dims;
        let stored = if self.packed { [b, s, h, d] } else { self.dims };
        let array = Array4::from_shape_vec(stored, values).map(|a| {
            if self.packed {
                let mut a = a;
                a.swap_axes(1, 2);
                a.as_standard_layout().into_owned()
            } else {
                a
            }
        });
        array.map_err(|e| {
            Error::File(format!(
                "{}: its data does not fill its shape {:?} of {}: {e}",
                self.label(),
                self.dims,
                self.view.dtype()
            ))
        })
    }
}

/// How errors refer to a tensor: by its name in the file and the file's path.
fn tensor_label(name: &str, path: &Path) -> String {
    format!("tensor `{name}` of {}", path.display())
}

/// Q, K, V (and dO when a fourth tensor was read) decoded.
fn decode_qkv<T: SafetensorsElement>(inputs: &[InputTensor]) -> Result<Qkv<T>> {
    let decoded = inputs
        .iter()
        .map(InputTensor::decode)
        .collect::<Result<Vec<Array4<T>>>>()?;
    let mut decoded = decoded.into_iter();
    let mut next = || {
        decoded
            .next()
            .ok_or_else(|| Error::File("fewer than three tensors read".into()))
    };
    let (q, k, v) = (next()?, next()?, next()?);
    // A fourth tensor is dO; a fourth and fifth are a KV-cache call's new keys and values.
    let (d_o, appended) = match (next().ok(), next().ok()) {
        (Some(k_new), Some(v_new)) => (None, Some((k_new, v_new))),
        (d_o, _) => (d_o, None),
    };
    Ok(Qkv {
        q,
        k,
        v,
        d_o,
        appended,
    })
}

/// What `flash-attn run` writes: O and L always, FA1's m and ℓ when the algorithm returns them.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionFileOutput<T> {
    /// (batch, heads, seqlen_q, head_dim), Q's dtype.
    pub o: Array4<T>,
    /// L, (batch, heads, seqlen_q).
    pub logsumexp: Array3<f32>,
    /// FA1's (m, ℓ), each (batch, heads, seqlen_q).
    pub row_max_and_sum: Option<(Array3<f32>, Array3<f32>)>,
    /// dQ, dK, dV when the backward ran, written as [`GRADIENT_NAMES`].
    pub gradients: Option<Gradients<Array4<T>>>,
    /// The caches after a KV-cache call appended to them, written as [`CACHE_NAMES`].
    pub caches: Option<(Array4<T>, Array4<T>)>,
}

/// Writes `output` to `path` as [`OUTPUT_NAME`], [`LOGSUMEXP_NAME`] and, when present,
/// [`ROW_MAX_NAME`] and [`ROW_SUM_NAME`] and the [`GRADIENT_NAMES`], with `metadata` as the file's string metadata (how the
/// outputs were made, so the file documents itself).
pub fn write_outputs<T: SafetensorsElement>(
    path: &Path,
    output: &AttentionFileOutput<T>,
    metadata: HashMap<String, String>,
) -> Result<()> {
    let mut tensors = vec![
        (OUTPUT_NAME, EncodedTensor::new(&output.o)),
        (LOGSUMEXP_NAME, EncodedTensor::new(&output.logsumexp)),
    ];
    if let Some((row_max, row_sum)) = &output.row_max_and_sum {
        tensors.push((ROW_MAX_NAME, EncodedTensor::new(row_max)));
        tensors.push((ROW_SUM_NAME, EncodedTensor::new(row_sum)));
    }
    if let Some(g) = &output.gradients {
        for (name, gradient) in GRADIENT_NAMES.into_iter().zip([&g.dq, &g.dk, &g.dv]) {
            tensors.push((name, EncodedTensor::new(gradient)));
        }
    }
    if let Some((k, v)) = &output.caches {
        tensors.push((CACHE_NAMES[0], EncodedTensor::new(k)));
        tensors.push((CACHE_NAMES[1], EncodedTensor::new(v)));
    }
    safetensors::serialize_to_file(tensors, Some(metadata), path)
        .map_err(|e| Error::File(format!("cannot write {}: {e}", path.display())))
}

/// Writes a packed batch's outputs to `path`: [`OUTPUT_NAME`] (total_q, heads, head_dim) from O's
/// logical (1, heads, total_q, head_dim), [`LOGSUMEXP_NAME`] (heads, total_q), and the
/// [`GRADIENT_NAMES`] when the backward ran (each (total, heads, head_dim) as its input), with
/// `metadata`.
pub fn write_packed_outputs<T: SafetensorsElement>(
    path: &Path,
    o: &Array4<T>,
    logsumexp: &Array2<f32>,
    gradients: Option<&Gradients<Array4<T>>>,
    metadata: HashMap<String, String>,
) -> Result<()> {
    // Logical (1, heads, total, d) to flash-attn's stored (total, heads, d).
    let stored = |a: &Array4<T>| {
        let mut rows = a.index_axis(Axis(0), 0).to_owned();
        rows.swap_axes(0, 1);
        EncodedTensor::new(&rows.as_standard_layout().into_owned())
    };
    let mut tensors = vec![
        (OUTPUT_NAME, stored(o)),
        (LOGSUMEXP_NAME, EncodedTensor::new(logsumexp)),
    ];
    if let Some(g) = gradients {
        for (name, gradient) in GRADIENT_NAMES.into_iter().zip([&g.dq, &g.dk, &g.dv]) {
            tensors.push((name, stored(gradient)));
        }
    }
    safetensors::serialize_to_file(tensors, Some(metadata), path)
        .map_err(|e| Error::File(format!("cannot write {}: {e}", path.display())))
}

/// An array's bytes in safetensors' encoding (logical row-major order, little-endian).
struct EncodedTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl EncodedTensor {
    fn new<T: SafetensorsElement, D: Dimension>(array: &Array<T, D>) -> Self {
        let mut bytes = Vec::with_capacity(array.len() * size_of::<T>());
        array.iter().for_each(|x| x.encode(&mut bytes));
        Self {
            dtype: T::SAFETENSORS_DTYPE,
            shape: array.shape().to_vec(),
            bytes,
        }
    }
}

impl View for EncodedTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}
