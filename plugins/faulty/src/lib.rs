//! A plugin that misbehaves on request, so tests can check that the host
//! contains it. The request body selects the behaviour:
//! `trap` panics, `loop` never returns, `alloc` asks for 1 GiB,
//! `bad` returns a bad-input error; anything else yields a zero-filled input
//! tensor (variable dimensions set to 1) and the default JSON postprocess.

use plinth_plugin_sdk::{Error, ModelInfo, Plugin, Request, Tensor, export_plugin};

struct Faulty {
    info: ModelInfo,
}

impl Plugin for Faulty {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        Ok(Faulty { info: info.clone() })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        match req.body.as_slice() {
            b"trap" => panic!("deliberate trap requested by the test"),
            b"loop" => loop {
                std::hint::black_box(());
            },
            b"alloc" => {
                let big = vec![1u8; 1 << 30];
                std::hint::black_box(&big);
                Err(Error::internal("allocated 1 GiB, which the host should have refused"))
            }
            b"bad" => Err(Error::bad_input("deliberate bad input")),
            _ => Ok(vec![self.zero_input()?]),
        }
    }
}

impl Faulty {
    fn zero_input(&self) -> Result<Tensor, Error> {
        let input = self.info.first_input()?;
        let mut shape: Vec<i64> = input.dims.iter().map(|&d| if d < 0 { 1 } else { d }).collect();
        if self.info.max_batch_size > 0 {
            shape.insert(0, 1);
        }
        let count = shape.iter().product::<i64>() as usize;
        Ok(Tensor::from_slice(&input.name, &shape, &vec![0.0f32; count]))
    }
}

export_plugin!(Faulty);
