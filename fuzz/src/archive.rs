//! AFL++ target: any bytes as a tar archive unpacked into a directory, checked by
//! `sandcell::testing::fuzz::check_unpack` (nothing outside the destination changes;
//! a refusal is typed and leaves the destination as it was).

fn main() {
    afl::fuzz!(|data: &[u8]| {
        sandcell::testing::fuzz::check_unpack(data);
    });
}
