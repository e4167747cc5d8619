//! Every integration suite with GPU work, one test binary (`gpu`): each suite a module, its tests
//! named `suite::test` (`cargo test --test gpu backward::`, `bundle/bin/test-gpu backward::`).
//! Without a GPU each GPU test says it was skipped and passes; `FLASH_ATTN_REQUIRE_GPU=1` (the
//! bundle's run script) turns that into a failure. One binary, because each links the library
//! and its embedded PTX: eight of them did not fit the GPU machine's 64 MiB transfer.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod backward;
mod decode;
mod gqa;
mod numerics;
mod packed;
mod safetensors_io;
mod window;
