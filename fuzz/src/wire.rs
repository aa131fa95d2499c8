//! AFL++ target: any bytes as a client's side of a wire-protocol connection, checked
//! by `sandcell::testing::fuzz::check_wire_server` (the server ends without a panic
//! and the backend still answers).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        sandcell::testing::fuzz::check_wire_server(data);
    });
}
