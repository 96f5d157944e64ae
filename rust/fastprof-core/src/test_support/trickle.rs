//! A reader that hands out at most `chunk` bytes per read, to exercise every
//! refill path of a streaming parser. Plain std, so the fuzz target (its own
//! crate) includes this file too.

use std::io::Read;

pub struct Trickle {
    data: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl Trickle {
    pub fn new(data: Vec<u8>, chunk: usize) -> Trickle {
        Trickle { data, at: 0, chunk }
    }
}

impl Read for Trickle {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.chunk.min(out.len()).min(self.data.len() - self.at);
        out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
