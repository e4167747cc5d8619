//! The predicted-traffic table: every algorithm's HBM bytes for one shape, with the block sizes the
//! host would pick, and its markdown form.

use flash_attn::attention::{Algorithm, fa1_blocks, fa2_blocks};
use flash_attn::dtype::DType;
use flash_attn::error::Result;

use crate::model::prediction::{
    IoShape, predicted_fa1_io, predicted_fa2_io, predicted_standard_io,
};
use crate::model::traffic::IoCounts;

/// The H200's opt-in shared memory per block, in bytes: the default budget of [`io_table`].
pub const H200_SHARED_MEMORY_PER_BLOCK: u32 = 232_448;

/// One line of the predicted-traffic table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoTableRow {
    pub shape: IoShape,
    pub dtype: DType,
    pub algorithm: Algorithm,
    /// (B_r, B_c) as the host would pick them; `None` for the standard attention.
    pub blocks: Option<(u32, u32)>,
    pub io: IoCounts,
}

/// Predicted HBM traffic of the standard attention, FA1, FA2 and, where it runs on tensor cores,
/// FA2-TC (in that order) for `shape` in
/// `dtype`, non-causal, with block sizes picked as the host picks them for a device with
/// `shared_memory_bytes` per block ([`H200_SHARED_MEMORY_PER_BLOCK`] on an H200). Computed from
/// the formulas, so it is instant for any length; an error for shapes the host would reject.
pub fn io_table(shape: IoShape, dtype: DType, shared_memory_bytes: u32) -> Result<Vec<IoTableRow>> {
    shape.check()?;
    let (_, fa1) = fa1_blocks(shape.head_dim, shared_memory_bytes, None)?;
    let (fa2_rows, fa2_cols) = fa2_blocks(shape.head_dim, shared_memory_bytes, None)?;
    let row = |algorithm, blocks, io| IoTableRow {
        shape,
        dtype,
        algorithm,
        blocks,
        io,
    };
    let mut rows = vec![
        row(
            Algorithm::Standard,
            None,
            predicted_standard_io(shape, dtype)?,
        ),
        row(
            Algorithm::Fa1,
            Some((fa1.block_rows, fa1.block_cols)),
            predicted_fa1_io(shape, fa1, dtype)?,
        ),
        row(
            Algorithm::Fa2,
            Some((fa2_rows, fa2_cols)),
            predicted_fa2_io(shape, fa2_rows, dtype)?,
        ),
    ];
    // FA2 on tensor cores moves the same tensors as FA2, with its own B_r; where it falls back
    // to the scalar FA2 (f32, other head dims) its row would repeat FA2's.
    let tc = flash_attn::attention::fa2_tc_head_dims().contains(&(shape.head_dim as u32));
    if dtype != DType::F32 && tc {
        let tiling =
            flash_kernels::fwd::fa2_tc::config::Fa2TcTiling::default_for(shape.head_dim as u32);
        let (tc_rows, tc_cols) = (tiling.block_rows(), tiling.block_cols);
        rows.push(row(
            Algorithm::Fa2Tc,
            Some((tc_rows, tc_cols)),
            predicted_fa2_io(shape, tc_rows, dtype)?,
        ));
    }
    // FA3 too is FA2's traffic (TMA's zero fill of padded columns reads nothing), with its B_r.
    if dtype != DType::F32 && shape.head_dim.is_multiple_of(2) {
        let head_dim = flash_kernels::fwd::fa3::config::HEAD_DIMS
            .into_iter()
            .find(|&d| d as usize >= shape.head_dim);
        if let Some(d) = head_dim {
            let tiling = flash_kernels::fwd::fa3::config::Fa3Tiling::default_for(
                d,
                false,
                shape.seqlen_k as u32,
            );
            rows.push(row(
                Algorithm::Fa3,
                Some((tiling.block_rows(), tiling.block_cols)),
                predicted_fa2_io(shape, tiling.block_rows(), dtype)?,
            ));
        }
    }
    Ok(rows)
}

/// The rows as a markdown table: shape, dtype, algorithm, blocks, bytes read, written and total.
pub fn io_table_markdown(rows: &[IoTableRow]) -> String {
    let mut table = String::from(
        "| batch × heads × N_q × N_k × d | dtype | algorithm | B_r × B_c | HBM read | HBM written | total |\n\
         |---|---|---|---|---:|---:|---:|\n",
    );
    for row in rows {
        let s = row.shape;
        let blocks = row
            .blocks
            .map_or_else(|| "–".to_string(), |(r, c)| format!("{r} × {c}"));
        let (read, written) = (row.io.bytes_read(), row.io.bytes_written());
        table.push_str(&format!(
            "| {} × {} × {} × {} × {} | {} | {} | {} | {} | {} | {} |\n",
            s.batch,
            s.heads,
            s.seqlen_q,
            s.seqlen_k,
            s.head_dim,
            row.dtype,
            row.algorithm,
            blocks,
            format_bytes(read),
            format_bytes(written),
            format_bytes(read.saturating_add(written)),
        ));
    }
    table
}

/// `bytes` in binary units with three significant digits or so: "512 B", "1.50 MiB".
fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}
