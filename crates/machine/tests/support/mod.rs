//! What the machine crate's integration tests share: the frames they
//! feed machines.

/// A 42-byte UDP/IPv4 Ethernet frame from `src`:`sport` to 10.0.0.1:53,
/// with an empty payload.
pub fn udp(src: u32, sport: u16) -> Vec<u8> {
    let mut f = vec![0u8; 42];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&28u16.to_be_bytes());
    f[23] = 17;
    f[26..30].copy_from_slice(&src.to_be_bytes());
    f[30..34].copy_from_slice(&0x0a00_0001u32.to_be_bytes());
    f[34..36].copy_from_slice(&sport.to_be_bytes());
    f[36..38].copy_from_slice(&53u16.to_be_bytes());
    f[38..40].copy_from_slice(&8u16.to_be_bytes());
    f
}
