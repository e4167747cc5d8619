//! TMA tensor maps for FA3: each operand's `CUtensorMap`, encoded on the host with
//! `cuTensorMapEncodeTiled`, and the device buffer the kernels read them from.
//!
//! A (batch, heads, seqlen, d) view with a contiguous last dimension is a 4-D tensor
//! (d, seqlen, heads, batch), innermost first, whose byte strides are the view's; the box is one
//! 64-column panel × the tile's rows, with the 128-byte swizzle the kernels' shared tiles use.
//! Rows past seqlen and columns past d are outside the tensor, and TMA fills them with zeros.
//! The maps go to global memory (a kernel parameter aligned to 64 bytes does not compile, see
//! `../shared/BUILD-FACTS.md`), up to five per call (Q, K, V; the persistent forward's O at
//! d ≤ 128, the target of its TMA stores in boxes of one warp's 16 rows; the backward's dO and its
//! f32 dQ accumulator, the target of bulk reductions in boxes of 32 columns), in a small ring of
//! slots reused by content: stream order makes overwriting a slot safe, since the copy runs after
//! every kernel launched before it.

use std::collections::HashMap;

use cudarc::driver::CudaSlice;
use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use flash_kernels::common::params::TensorView;
use flash_kernels::fwd::fa3::config::{F32_BOX_COLS, PANEL_COLS};
use flash_kernels::registry::ElementType;

use super::Gpu;
use crate::error::{CudaContextExt, Error, Result};

/// 64-bit words of one `CUtensorMap`.
pub const TENSOR_MAP_WORDS: usize = 16;
/// Maps of one call: Q, K, V, and for the backward dO and the dQ accumulator (the forward
/// leaves the last two zero, or puts O fourth where the persistent kernel stores it by TMA).
pub const CALL_MAPS: usize = 5;
/// Words of one call's maps.
pub const CALL_WORDS: usize = CALL_MAPS * TENSOR_MAP_WORDS;
/// Slots of the device ring (a benchmark rotating its inputs through several buffers stays in
/// it, so steady-state calls copy nothing).
const SLOTS: usize = 64;

/// One operand for a tensor map: its view, dims (batch, heads, seqlen, d) and the tile rows.
pub struct MapOperand<'a> {
    pub name: &'static str,
    pub view: &'a TensorView,
    pub dims: [usize; 4],
    pub box_rows: u32,
}

impl<'a> MapOperand<'a> {
    pub fn new(name: &'static str, view: &'a TensorView, dims: [usize; 4], box_rows: u32) -> Self {
        Self {
            name,
            view,
            dims,
            box_rows,
        }
    }
}

/// Encodes the tensor map of one 16-bit operand. Fails, naming the operand, where TMA cannot
/// address it (the plan checks alignment first, so this is a second line of defence).
pub fn encode(operand: &MapOperand, dtype: ElementType) -> Result<[u64; TENSOR_MAP_WORDS]> {
    let data_type = match dtype {
        ElementType::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        ElementType::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        ElementType::F32 => {
            return Err(Error::invalid(
                "dtype",
                "f32",
                "FA3 takes f16 or bf16 (the plan runs f32 elsewhere)",
            ));
        }
    };
    let view = operand.view;
    let [batch, heads, seqlen, head_dim] = operand.dims;
    encode_tiled(
        operand.name,
        data_type,
        view.addr,
        [head_dim, seqlen, heads, batch],
        [view.row_stride, view.head_stride, view.batch_stride].map(|s| s * 2),
        [PANEL_COLS, operand.box_rows],
    )
}

/// Encodes the map of the backward's f32 dQ accumulator at `addr`, contiguous (batch, heads,
/// seqlen_q, d) as `dims` gives them, with boxes of 32 columns (one 128-byte swizzle row) ×
/// `box_rows`: the FA3 backward adds its staged dQ_i tiles through it.
pub fn encode_accumulator(
    addr: u64,
    dims: [usize; 4],
    box_rows: u32,
) -> Result<[u64; TENSOR_MAP_WORDS]> {
    let [_, heads, seqlen, head_dim] = dims;
    let row_bytes = head_dim as u64 * 4;
    let head_bytes = row_bytes * seqlen as u64;
    encode_tiled(
        "the dQ accumulator",
        CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        addr,
        [head_dim, seqlen, heads, dims[0]],
        [row_bytes, head_bytes, head_bytes * heads as u64],
        [F32_BOX_COLS, box_rows],
    )
}

/// `cuTensorMapEncodeTiled` of a 4-D tensor (dims innermost first, byte strides of dims 1–3)
/// with boxes of `box_dims` (columns, rows) × 1 × 1 and the 128-byte swizzle.
fn encode_tiled(
    name: &'static str,
    data_type: CUtensorMapDataType,
    addr: u64,
    dims: [usize; 4],
    strides: [u64; 3],
    [box_cols, box_rows]: [u32; 2],
) -> Result<[u64; TENSOR_MAP_WORDS]> {
    let dims = dims.map(|d| d.max(1) as u64);
    if !addr.is_multiple_of(16) || strides.iter().any(|s| !s.is_multiple_of(16)) {
        return Err(Error::invalid(
            name,
            format!("address {addr:#x}, strides {strides:?} bytes"),
            "16-byte aligned address and strides for TMA",
        ));
    }
    let box_dims = [box_cols, box_rows, 1, 1];
    let element_strides = [1u32; 4];
    let mut map = CUtensorMap {
        opaque: [0; TENSOR_MAP_WORDS],
    };
    // SAFETY: every array has the rank's 4 (strides: 3) entries; the address is the tensor's
    // device memory, which the map only describes.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            4,
            addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_dims.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .context(|| {
        format!(
            "cuTensorMapEncodeTiled({name}: dims {dims:?}, strides {strides:?}, box {box_dims:?})"
        )
    })?;
    Ok(map.opaque)
}

/// One call's maps, consecutive in the order of `operands` (at most four 16-bit operands), the
/// rest zero.
pub fn encode_call(operands: &[MapOperand], dtype: ElementType) -> Result<[u64; CALL_WORDS]> {
    assert!(
        operands.len() < CALL_MAPS,
        "at most four operand maps a call"
    );
    let mut maps = [0u64; CALL_WORDS];
    for (i, operand) in operands.iter().enumerate() {
        maps[i * TENSOR_MAP_WORDS..(i + 1) * TENSOR_MAP_WORDS]
            .copy_from_slice(&encode(operand, dtype)?);
    }
    Ok(maps)
}

/// The device ring of tensor-map slots and which maps each holds.
#[derive(Default)]
pub struct TensorMapCache {
    buffer: Option<CudaSlice<u64>>,
    slot_of: HashMap<[u64; CALL_WORDS], usize>,
    held: Vec<Option<[u64; CALL_WORDS]>>,
    next: usize,
}

impl Gpu {
    /// The device address of one call's maps ([`encode_call`]), copied into a slot of the ring
    /// unless a slot already holds them.
    pub(crate) fn tensor_maps(&self, maps: [u64; CALL_WORDS]) -> Result<u64> {
        let mut cache = self
            .tensor_maps
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if cache.buffer.is_none() {
            let buffer = self
                .stream
                .alloc_zeros::<u64>(SLOTS * CALL_WORDS)
                .context(|| "allocating the tensor maps".into())?;
            cache.buffer = Some(buffer);
            cache.held = vec![None; SLOTS];
        }
        let slot = match cache.slot_of.get(&maps) {
            Some(&slot) => slot,
            None => {
                let slot = cache.next;
                cache.next = (slot + 1) % SLOTS;
                if let Some(old) = cache.held[slot].take() {
                    cache.slot_of.remove(&old);
                }
                let buffer = cache.buffer.as_mut().expect("allocated above");
                let mut view = buffer.slice_mut(slot * CALL_WORDS..(slot + 1) * CALL_WORDS);
                self.stream
                    .memcpy_htod(&maps, &mut view)
                    .context(|| "copying the tensor maps".into())?;
                cache.held[slot] = Some(maps);
                cache.slot_of.insert(maps, slot);
                slot
            }
        };
        let base = self.address(cache.buffer.as_ref().expect("allocated above"));
        Ok(base + (slot * CALL_WORDS * 8) as u64)
    }
}
