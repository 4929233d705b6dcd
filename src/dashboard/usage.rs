//! Usage of the last 30 UTC days, from the billing figures: a chart drawn
//! here as SVG (no script), the same numbers as a table, and as CSV.

use std::collections::BTreeMap;
use std::fmt::Write;

use axum::extract::{Query, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use chrono::{Duration, NaiveDate, Utc};
use serde::Deserialize;

use super::error::DashError;
use super::pages::{render, KeyChoice, UsageDay, UsagePage, UsageView};
use super::session::SignedIn;
use crate::access::{AccountId, KeyId};
use crate::http::AppState;
use crate::store::Period;

pub const DAYS: i64 = 30;

#[derive(Deserialize)]
pub struct UsageQuery {
    key: Option<String>,
}

/// Billable requests, items and rate-limited requests per day, oldest
/// first, for the account's keys (or one of them), every day present.
pub async fn daily_usage(
    state: &AppState,
    account: &AccountId,
    only: Option<&KeyId>,
) -> Result<Vec<UsageDay>, DashError> {
    let today = Utc::now().date_naive();
    let first = today - Duration::days(DAYS - 1);
    let mut totals: BTreeMap<NaiveDate, (u64, u64, u64)> = (0..DAYS)
        .map(|i| (first + Duration::days(i), (0, 0, 0)))
        .collect();
    let keys = state.store.account_keys(account).await?;
    // One billing query per key: each uses the (key_id, at) index.
    for key in keys
        .iter()
        .filter(|k| only.is_none_or(|id| *id == k.key.id))
    {
        let rows = state
            .store
            .billing(Period::Day, Some(&key.key.id), Some(first))
            .await?;
        for row in rows {
            if let Some(day) = totals.get_mut(&row.period_start) {
                day.0 += row.requests;
                day.1 += row.text_items + row.image_items;
                day.2 += row.rate_limited;
            }
        }
    }
    Ok(totals
        .into_iter()
        .map(|(day, (requests, items, rate_limited))| UsageDay {
            day: day.format("%Y-%m-%d").to_string(),
            requests,
            items,
            rate_limited,
        })
        .collect())
}

pub fn usage_view(days: Vec<UsageDay>) -> UsageView {
    UsageView {
        chart_svg: chart(&days),
        total_requests: days.iter().map(|d| d.requests).sum(),
        total_items: days.iter().map(|d| d.items).sum(),
        total_rate_limited: days.iter().map(|d| d.rate_limited).sum(),
        days,
    }
}

/// The `?key=` of a request: one of the account's keys, or 404.
async fn selected_key(
    state: &AppState,
    user: &SignedIn,
    query: &UsageQuery,
) -> Result<Option<KeyId>, DashError> {
    let Some(text) = query.key.as_deref().filter(|k| !k.is_empty()) else {
        return Ok(None);
    };
    let id = KeyId::parse(text).ok_or(DashError::NotFound)?;
    let owned = state
        .store
        .account_keys(&user.account.id)
        .await?
        .iter()
        .any(|k| k.key.id == id);
    if owned {
        Ok(Some(id))
    } else {
        Err(DashError::NotFound)
    }
}

pub async fn page(
    State(state): State<AppState>,
    user: SignedIn,
    Query(query): Query<UsageQuery>,
) -> Result<Response, DashError> {
    let selected = selected_key(&state, &user, &query).await?;
    let days = daily_usage(&state, &user.account.id, selected.as_ref()).await?;
    let keys = state.store.account_keys(&user.account.id).await?;
    let mut choices = vec![KeyChoice {
        href: "/dashboard/usage".into(),
        label: "All keys".into(),
        current: selected.is_none(),
    }];
    choices.extend(keys.iter().map(|k| KeyChoice {
        href: format!("/dashboard/usage?key={}", k.key.id),
        label: format!("{} ({})", k.key.name, k.key.id),
        current: selected.as_ref() == Some(&k.key.id),
    }));
    let csv_href = match &selected {
        Some(id) => format!("/dashboard/usage.csv?key={id}"),
        None => "/dashboard/usage.csv".into(),
    };
    let page = UsagePage {
        nav: user.nav(),
        usage: usage_view(days),
        choices,
        csv_href,
    };
    Ok(render(&page))
}

pub async fn csv(
    State(state): State<AppState>,
    user: SignedIn,
    Query(query): Query<UsageQuery>,
) -> Result<Response, DashError> {
    let selected = selected_key(&state, &user, &query).await?;
    let body = csv_by_policy(&state, &user.account.id, selected.as_ref()).await?;
    let filename = match &selected {
        Some(id) => format!("attachment; filename=\"moderato-usage-{id}.csv\""),
        None => "attachment; filename=\"moderato-usage.csv\"".to_owned(),
    };
    Ok((
        [
            (CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (CONTENT_DISPOSITION, filename),
        ],
        body,
    )
        .into_response())
}

/// The CSV: the figures of [`daily_usage`] per UTC day and per policy the
/// requests were judged under (the last column: its id, empty for none), so
/// a bill can tell strict from lenient traffic. A day without traffic is
/// one row of zeros.
async fn csv_by_policy(
    state: &AppState,
    account: &AccountId,
    only: Option<&KeyId>,
) -> Result<String, DashError> {
    let today = Utc::now().date_naive();
    let first = today - Duration::days(DAYS - 1);
    let mut totals: BTreeMap<(NaiveDate, String), (u64, u64, u64)> = BTreeMap::new();
    let keys = state.store.account_keys(account).await?;
    for key in keys
        .iter()
        .filter(|k| only.is_none_or(|id| *id == k.key.id))
    {
        for row in state.store.policy_usage(&key.key.id, first).await? {
            let policy = row.policy_id.map(|p| p.to_string()).unwrap_or_default();
            let day = totals.entry((row.day, policy)).or_default();
            day.0 += row.requests;
            day.1 += row.items;
            day.2 += row.rate_limited;
        }
    }
    for i in 0..DAYS {
        let day = first + Duration::days(i);
        if !totals.keys().any(|(d, _)| *d == day) {
            totals.insert((day, String::new()), (0, 0, 0));
        }
    }
    let mut body = String::from("day,requests,items,rate_limited,policy\n");
    for ((day, policy), (requests, items, rate_limited)) in totals {
        let _ = writeln!(
            body,
            "{},{requests},{items},{rate_limited},{policy}",
            day.format("%Y-%m-%d")
        );
    }
    Ok(body)
}

/// A chart line: its CSS class and the day's value it draws.
type Series = (&'static str, fn(&UsageDay) -> u64);

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 240.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

/// Three lines (billable requests, items, rate-limited requests) over the
/// days, with a y axis from 0 to the largest value. Only numbers and fixed
/// text go into the markup.
pub fn chart(days: &[UsageDay]) -> String {
    let max = days
        .iter()
        .flat_map(|d| [d.requests, d.items, d.rate_limited])
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let step = plot_w / (days.len().max(2) - 1) as f64;
    let x = |i: usize| LEFT + step * i as f64;
    let y = |v: u64| TOP + plot_h - plot_h * (v as f64 / max as f64);
    let total: u64 = days.iter().map(|d| d.requests).sum();
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg data-testid=\"usage-chart\" class=\"chart\" role=\"img\" \
         aria-label=\"Billable requests, items and rate-limited requests per day over the last {} days: {} billable requests in all\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" xmlns=\"http://www.w3.org/2000/svg\">",
        days.len(),
        total
    );
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\"/>\
         <line class=\"axis\" x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\"/>\
         <text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\">{max}</text>\
         <text x=\"{lx}\" y=\"{b}\" text-anchor=\"end\">0</text>",
        b = TOP + plot_h,
        r = WIDTH - RIGHT,
        lx = LEFT - 6.0,
        ty = TOP + 10.0,
    );
    for (i, d) in days.iter().enumerate().step_by(7) {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(i),
            HEIGHT - 8.0,
            d.day.get(5..).unwrap_or(&d.day)
        );
    }
    let series: [Series; 3] = [
        ("requests", |d| d.requests),
        ("items", |d| d.items),
        ("rate_limited", |d| d.rate_limited),
    ];
    for (class, value) in series {
        let points: Vec<String> = days
            .iter()
            .enumerate()
            .map(|(i, d)| format!("{:.1},{:.1}", x(i), y(value(d))))
            .collect();
        let _ = write!(
            svg,
            "<polyline class=\"{class}\" data-series=\"{class}\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_scales_to_the_largest_value() {
        let days: Vec<UsageDay> = (0..30)
            .map(|i| UsageDay {
                day: format!("2026-11-{:02}", i + 1),
                requests: if i == 29 { 8 } else { 0 },
                items: if i == 29 { 10 } else { 0 },
                rate_limited: 0,
            })
            .collect();
        let svg = chart(&days);
        assert!(svg.starts_with("<svg data-testid=\"usage-chart\""));
        assert!(svg.contains(">10</text>"), "{svg}");
        // The last point of the items line is at the top of the plot.
        assert!(
            svg.contains(&format!("{:.1},{:.1}\"", WIDTH - RIGHT, TOP)),
            "{svg}"
        );
        assert_eq!(svg.matches("<polyline").count(), 3);
    }
}
