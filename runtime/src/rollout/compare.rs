//! Whether a candidate's answer agrees with the serving version's, for a
//! rollout's shadow phase: tensors by name, shape and type, floating-point
//! elements within the plan's tolerance, everything else byte for byte; a
//! plugin's raw answers byte for byte.

use half::{bf16, f16};

use super::ShadowPlan;
use crate::tensor::{DataType, Tensor};

/// `Ok` when `candidate` agrees with `serving`, else the first difference.
pub fn tensors(serving: &[Tensor], candidate: &[Tensor], plan: &ShadowPlan) -> Result<(), String> {
    if serving.len() != candidate.len() {
        return Err(format!("{} outputs against {}", candidate.len(), serving.len()));
    }
    for (s, c) in serving.iter().zip(candidate) {
        if (&s.name, s.datatype, &s.shape) != (&c.name, c.datatype, &c.shape) {
            return Err(format!(
                "output '{}' {} {:?} against '{}' {} {:?}",
                c.name, c.datatype, c.shape, s.name, s.datatype, s.shape
            ));
        }
        elements(s, c, plan.tolerance_of(&s.name))?;
    }
    Ok(())
}

/// `Ok` when two raw answers are the same.
pub fn raw(serving: (&str, &[u8]), candidate: (&str, &[u8])) -> Result<(), String> {
    if serving.0 != candidate.0 {
        return Err(format!("content type {} against {}", candidate.0, serving.0));
    }
    match serving.1.iter().zip(candidate.1).position(|(s, c)| s != c) {
        _ if serving.1.len() != candidate.1.len() => {
            Err(format!("{} bytes against {}", candidate.1.len(), serving.1.len()))
        }
        Some(at) => Err(format!("the answers differ from byte {at}")),
        None => Ok(()),
    }
}

fn elements(s: &Tensor, c: &Tensor, tolerance: f64) -> Result<(), String> {
    let values = |t: &Tensor| -> Option<Vec<f64>> {
        let d = &t.data;
        Some(match t.datatype {
            DataType::Fp64 => d.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect(),
            DataType::Fp32 => d.chunks_exact(4).map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap()))).collect(),
            DataType::Fp16 => d.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
            DataType::Bf16 => d.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
            _ => return None,
        })
    };
    match (values(s), values(c)) {
        (Some(sv), Some(cv)) => {
            for (i, (a, b)) in sv.iter().zip(&cv).enumerate() {
                // NaN agrees only with NaN.
                let agree = (a.is_nan() && b.is_nan()) || (a - b).abs() <= tolerance;
                if !agree {
                    return Err(format!("output '{}' element {i}: {b} against {a} (tolerance {tolerance})", s.name));
                }
            }
            Ok(())
        }
        _ if s.data == c.data => Ok(()),
        _ => Err(format!("output '{}' differs ({})", s.name, s.datatype)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp32(name: &str, values: &[f32]) -> Tensor {
        Tensor {
            name: name.into(),
            datatype: DataType::Fp32,
            shape: vec![values.len() as i64],
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    fn plan(json: &str) -> ShadowPlan {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn floats_agree_within_their_output_s_tolerance() {
        let exact = plan("{}");
        let loose = plan(r#"{"tolerance": 0.01, "output_tolerances": {"Z": 0}}"#);
        let (s, c) = ([fp32("Y", &[1.0, 2.0])], [fp32("Y", &[1.0, 2.005])]);
        assert!(tensors(&s, &c, &exact).unwrap_err().starts_with("output 'Y' element 1: 2.005"));
        assert_eq!(tensors(&s, &c, &loose), Ok(()));
        let (s, c) = ([fp32("Z", &[1.0])], [fp32("Z", &[1.005])]);
        assert!(tensors(&s, &c, &loose).is_err(), "Z is held exact");
        assert!(tensors(&[fp32("Y", &[1.0])], &[fp32("Y", &[1.0, 2.0])], &loose).unwrap_err().contains("[2]"));
    }

    #[test]
    fn raw_answers_agree_byte_for_byte() {
        assert_eq!(raw(("text/plain", b"hello"), ("text/plain", b"hello")), Ok(()));
        assert_eq!(
            raw(("text/plain", b"hello"), ("text/plain", b"help!")).unwrap_err(),
            "the answers differ from byte 3"
        );
        assert!(raw(("a", b""), ("b", b"")).is_err());
    }
}
