//! `flash-attn run`: one algorithm on the user's tensors (placeholder until implemented).

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct RunArgs {}

pub fn main(_device: usize, _args: &RunArgs) -> flash_attn::Result<ExitCode> {
    Err(flash_attn::Error::File("`run` is not implemented yet".into()))
}
