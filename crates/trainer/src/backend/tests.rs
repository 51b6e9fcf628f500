//! Device names, and the one-line refusals of a device this build or this machine cannot use.

use super::*;

#[test]
fn device_names_parse_and_print_back() {
    for (text, device) in [
        ("cpu", DeviceKind::Cpu),
        ("cuda", DeviceKind::Cuda(0)),
        ("cuda:3", DeviceKind::Cuda(3)),
    ] {
        assert_eq!(text.parse::<DeviceKind>().unwrap(), device);
    }
    assert_eq!(DeviceKind::Cuda(3).to_string(), "cuda:3");
    for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""] {
        let err = bad.parse::<DeviceKind>().unwrap_err().to_string();
        assert_eq!(
            err,
            format!("device {bad} is not available: expected cpu, cuda or cuda:N"),
            "{bad:?}"
        );
    }
    assert!(DeviceKind::Cpu.check().is_ok());
}

#[cfg(not(feature = "cuda"))]
#[test]
fn a_cpu_only_build_refuses_cuda_in_one_line() {
    use crate::model::CausalLm;
    use crate::{
        Architecture, ModelConfig, Policy, PolicyOptions, TrainConfig, Trainer, TrainerOptions, Weights,
    };

    let c = ModelConfig::new(Architecture::Llama, 29, 16, 24, 1, 2, 1);
    let w = Weights::from_model(&CausalLm::<Cpu>::init(&c, 0.1, 1, &Default::default()));
    let want =
        "device cuda:1 is not available: this build has no `cuda` feature (build with `--features cuda`)";
    let policy = Policy::from_weights(
        c.clone(),
        &w,
        PolicyOptions {
            device: DeviceKind::Cuda(1),
            ..PolicyOptions::default()
        },
    );
    assert_eq!(policy.unwrap_err().to_string(), want);
    let trainer = Trainer::new(
        c,
        &w,
        TrainConfig::default(),
        TrainerOptions {
            device: DeviceKind::Cuda(1),
            bf16_autocast: false,
        },
    );
    assert_eq!(trainer.unwrap_err().to_string(), want);
}

#[test]
fn bf16_inference_is_refused_on_the_cpu_in_one_line() {
    use crate::model::CausalLm;
    use crate::{Architecture, ModelConfig, Policy, PolicyOptions, Weights};

    assert_eq!("bf16".parse::<InferenceDtype>().unwrap(), InferenceDtype::Bf16);
    assert_eq!("f32".parse::<InferenceDtype>().unwrap(), InferenceDtype::F32);
    assert_eq!(InferenceDtype::Bf16.to_string(), "bf16");
    let err = "fp16".parse::<InferenceDtype>().unwrap_err().to_string();
    assert!(
        err.contains("\"fp16\" is not an inference dtype: expected f32 or bf16"),
        "{err}"
    );
    let c = ModelConfig::new(Architecture::Llama, 29, 16, 24, 1, 2, 1);
    let w = Weights::from_model(&CausalLm::<Cpu>::init(&c, 0.1, 1, &Default::default()));
    let err = Policy::from_weights(
        c,
        &w,
        PolicyOptions {
            dtype: InferenceDtype::Bf16,
            ..PolicyOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "device cpu is not available: bf16 weights for inference need a CUDA device (the CPU kernels are f32)"
    );
    assert!(InferenceDtype::Bf16.check_on(DeviceKind::Cuda(0)).is_ok());
}

/// Where no driver is installed (CI, this machine) the refusal names the library; where one is, a device
/// index past the last one is refused instead.
#[cfg(feature = "cuda")]
#[test]
fn a_cuda_build_without_a_driver_refuses_in_one_line() {
    match check_cuda(0) {
        Err(e) => {
            let text = e.to_string();
            assert!(text.starts_with("device cuda:0 is not available: "), "{text}");
            assert!(text.contains("libcuda.so.1") || text.contains("cuInit"), "{text}");
            assert!(!text.contains('\n'), "{text}");
        }
        Ok(()) => {
            let text = check_cuda(1 << 20).unwrap_err().to_string();
            assert!(text.contains("CUDA device(s)"), "{text}");
        }
    }
}
