//! The dashboard's errors and the one place they become responses (HTML
//! pages, never the API's JSON bodies).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};

use super::pages::{render, ErrorPage};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum DashError {
    /// Also what another account's key, or an admin page seen by a
    /// customer, answers: nothing tells them it exists.
    #[error("page not found")]
    NotFound,
    /// A state-changing request without the form's valid CSRF token.
    #[error("the form has expired or did not come from this site: reload the page and try again")]
    Forbidden,
    /// A state-changing request from a page of another origin.
    #[error(
        "this form was sent from another site: open the dashboard at its own address and try again"
    )]
    CrossOrigin,
    /// No valid session: off to the sign-in page.
    #[error("sign in first")]
    SignInRequired,
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("internal: {0}")]
    Internal(String),
}

impl IntoResponse for DashError {
    fn into_response(self) -> Response {
        let status = match &self {
            DashError::NotFound => StatusCode::NOT_FOUND,
            DashError::Forbidden | DashError::CrossOrigin => StatusCode::FORBIDDEN,
            DashError::SignInRequired => {
                return Redirect::to("/dashboard/login").into_response();
            }
            DashError::Store(StoreError::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
            DashError::Store(_) | DashError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = match &self {
            DashError::Store(_) | DashError::Internal(_) => {
                // Details go to the log, not to the page.
                tracing::error!(error = %self, "dashboard request failed");
                if status == StatusCode::SERVICE_UNAVAILABLE {
                    "The service is temporarily unavailable; try again shortly.".to_owned()
                } else {
                    "An internal error occurred; it has been logged.".to_owned()
                }
            }
            other => other.to_string(),
        };
        let page = ErrorPage {
            nav: None,
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            message,
        };
        (status, render(&page)).into_response()
    }
}
