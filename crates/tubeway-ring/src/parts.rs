//! A record given as several slices (say a frame head and a payload), copied
//! without first concatenating them.

/// Total length of `parts`; saturates (the same slice may be given many
/// times), which any size check then refuses.
pub(crate) fn total_len(parts: &[&[u8]]) -> usize {
    parts
        .iter()
        .fold(0usize, |sum, part| sum.saturating_add(part.len()))
}

/// The pieces of `len` bytes of the concatenation of `parts`, starting at
/// byte `skip`. Yields fewer bytes if `parts` is shorter.
pub(crate) fn chunks<'a>(
    parts: &'a [&'a [u8]],
    skip: usize,
    len: usize,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut skip = skip;
    let mut left = len;
    parts.iter().filter_map(move |part| {
        if skip >= part.len() {
            skip -= part.len();
            return None;
        }
        let rest = part.get(skip..).unwrap_or_default();
        skip = 0;
        let take = rest.len().min(left);
        left -= take;
        rest.get(..take).filter(|chunk| !chunk.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gather(parts: &[&[u8]], skip: usize, len: usize) -> Vec<u8> {
        chunks(parts, skip, len).flatten().copied().collect()
    }

    #[test]
    fn chunks_cover_any_window() {
        let parts: [&[u8]; 4] = [b"ab", b"", b"cdef", b"g"];
        let all = b"abcdefg";
        for skip in 0..=all.len() {
            for len in 0..=all.len() - skip {
                assert_eq!(gather(&parts, skip, len), &all[skip..skip + len]);
            }
        }
        assert_eq!(total_len(&parts), 7);
    }

    #[test]
    fn total_len_saturates() {
        let big = vec![0u8; 1 << 20];
        let parts = vec![big.as_slice(); 4];
        assert_eq!(total_len(&parts), 4 << 20);
        assert_eq!(total_len(&[]), 0);
    }
}
