//! The deep image analysis by a third-party vision model (OpenAI-compatible
//! Chat Completions).
//!
//! INTERFACE STUB — the images work (issue 5) replaces the bodies.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::image::ImageFormat;

/// Operator configuration of the provider. Absent base URL or model means
/// "no provider configured": images never leave the machine.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct VisionSettings {
    pub base_url: Option<String>,
    pub model: Option<String>,
    /// Secret: never logged, never serialised back out.
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
}

/// Outcome of the deep analysis for one image item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnalysisStatus {
    Completed,
    Failed,
    NotRequested,
    Unavailable,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AnalysisError {
    pub code: String,
    pub message: String,
}

/// The `image_analysis` object of an image result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ImageAnalysis {
    pub status: AnalysisStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Only the categories the provider evaluated, each in [0, 1].
    pub category_scores: BTreeMap<String, f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rationale: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<AnalysisError>,
}

impl ImageAnalysis {
    pub fn with_status(status: AnalysisStatus) -> ImageAnalysis {
        ImageAnalysis { status, model: None, category_scores: BTreeMap::new(), rationale: None, error: None }
    }
}

/// One image to analyse.
#[derive(Clone, Debug)]
pub struct VisionImage {
    pub format: ImageFormat,
    pub bytes: Bytes,
}

/// Client for the configured provider. Cheap to clone and shared by all requests.
#[derive(Clone, Debug)]
pub struct VisionClient {}

impl VisionClient {
    /// `Ok(None)` when no provider is configured.
    pub fn from_settings(_settings: &VisionSettings) -> anyhow::Result<Option<VisionClient>> {
        Ok(None)
    }

    /// Analyses every image within the configured overall timeout. Never
    /// fails as a whole: each image gets its own status. Returns one entry per
    /// input, in order.
    pub async fn analyze(&self, images: Vec<VisionImage>) -> Vec<ImageAnalysis> {
        images.iter().map(|_| ImageAnalysis::with_status(AnalysisStatus::Unavailable)).collect()
    }
}
