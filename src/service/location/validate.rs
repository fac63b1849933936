//! Validation of location requests: each `LocationRequest` is checked against the configured rules and
//! its defaults filled in, or rejected naming the field, the rule and the gRPC code.
pub use crate::broker::message::{AdmittedRequest, AdmittedUpdate, Rejection};
use crate::broker::provider_queues::ProviderQueues;
use crate::config::{CloakModel, GeoIndConfig, LocationConfig};
use crate::proto::{self, LocationRequest, PositionUpdate};

/// Longest user id accepted, in bytes.
pub const MAX_USER_ID_BYTES: usize = 256;

/// Checks one request against the configured rules and fills in defaults; its service becomes the
/// index of the service's queue in `queues`.
pub fn validate(
    req: LocationRequest,
    cfg: &LocationConfig,
    queues: &ProviderQueues,
) -> Result<AdmittedRequest, Rejection> {
    check_user_and_position(&req.user_id, req.lat, req.lon)?;
    let k = req.k.unwrap_or(cfg.default_k);
    if k < cfg.min_k || k > cfg.max_k {
        return Err(Rejection::invalid(
            "k",
            format!("must lie in [{}, {}] (got {k})", cfg.min_k, cfg.max_k),
        ));
    }
    // At least what padding needs: grouping uses the tolerance less twice the 2 m margin.
    let least = crate::location::padding::MIN_TOLERANCE_M;
    let tolerance = |field: &'static str, v: Option<f64>, default: f64, max: f64| {
        let v = v.unwrap_or(default);
        if !v.is_finite() || v < least || v > max {
            Err(Rejection::invalid(
                field,
                format!(
                    "must be a tolerance in metres in [{least}, {max}] (got {v}; padding keeps box edges {} m off the members and needs at least {least} m)",
                    crate::location::padding::MIN_PAD_M
                ),
            ))
        } else {
            Ok(v)
        }
    };
    let dx_m = tolerance("dx_m", req.dx_m, cfg.default_dx_m, cfg.max_dx_m)?;
    let dy_m = tolerance("dy_m", req.dy_m, cfg.default_dy_m, cfg.max_dy_m)?;
    // No box is clamped, wrapped or shifted at a pole or the antimeridian: such requests are refused.
    crate::location::padding::world_rule(&crate::location::geo::constraint_box(
        req.lat, req.lon, dx_m, dy_m,
    ))
    .map_err(|(field, rule)| Rejection::invalid(field, rule))?;
    let dt_ms = req.dt_ms.unwrap_or(cfg.default_dt_ms);
    if dt_ms == 0 || dt_ms > cfg.max_dt_ms {
        return Err(Rejection::invalid(
            "dt_ms",
            format!(
                "must be a tolerance in milliseconds in [1, {}] (got {dt_ms})",
                cfg.max_dt_ms
            ),
        ));
    }
    if req.payload.len() > cfg.max_payload_bytes {
        return Err(Rejection::invalid(
            "payload",
            format!(
                "must be at most {} bytes (got {})",
                cfg.max_payload_bytes,
                req.payload.len()
            ),
        ));
    }
    let queue = cfg
        .services
        .contains(&req.service)
        .then(|| queues.index_of(&req.service))
        .flatten();
    let Some(service) = queue else {
        return Err(Rejection::invalid(
            "service",
            format!(
                "unknown service {}; this broker serves {:?}",
                crate::service::quote(&req.service),
                cfg.services
            ),
        ));
    };
    let model = match req.model {
        None => cfg.default_model,
        Some(m) if m == proto::CloakModel::Requests as i32 => CloakModel::Requests,
        Some(m) if m == proto::CloakModel::Presence as i32 => CloakModel::Presence,
        Some(m) if m == proto::CloakModel::GeoInd as i32 => CloakModel::GeoInd,
        Some(m) => {
            return Err(Rejection::invalid(
                "model",
                format!(
                    "must be REQUESTS (1), PRESENCE (2) or GEO_IND (3), or unset for the broker's default (got {m})"
                ),
            ));
        }
    };
    let (epsilon_per_km, fallback_epsilon_per_km) = geo_ind_levels(&req, model, &cfg.geo_ind)?;
    Ok(AdmittedRequest {
        user_id: req.user_id,
        request_no: req.request_no,
        lat: req.lat,
        lon: req.lon,
        k,
        dx_m,
        dy_m,
        dt_ms,
        payload: req.payload,
        service,
        model,
        epsilon_per_km,
        fallback_epsilon_per_km,
    })
}

/// The GEO_IND privacy level (GEO_IND only, default filled in) and the fallback level (REQUESTS
/// only), each inside [min_epsilon_per_km, max_epsilon_per_km]; a GEO_IND request (or one with a
/// fallback) must come from inside the truncation region.
fn geo_ind_levels(
    req: &LocationRequest,
    model: CloakModel,
    cfg: &GeoIndConfig,
) -> Result<(Option<f64>, Option<f64>), Rejection> {
    let level = |field: &'static str, v: f64| {
        if v.is_finite() && cfg.min_epsilon_per_km <= v && v <= cfg.max_epsilon_per_km {
            Ok(v)
        } else {
            Err(Rejection::invalid(
                field,
                format!(
                    "must lie in [{}, {}] per km (location.geo_ind.min_epsilon_per_km, max_epsilon_per_km; got {v})",
                    cfg.min_epsilon_per_km, cfg.max_epsilon_per_km
                ),
            ))
        }
    };
    let epsilon = match (model, req.epsilon_per_km) {
        (CloakModel::GeoInd, v) => Some(level(
            "epsilon_per_km",
            v.unwrap_or(cfg.default_epsilon_per_km),
        )?),
        (_, None) => None,
        (_, Some(_)) => {
            return Err(Rejection::invalid(
                "epsilon_per_km",
                "is only used under GEO_IND; leave it unset",
            ));
        }
    };
    let fallback = match (model, req.fallback_epsilon_per_km) {
        (_, None) => None,
        (CloakModel::Requests, Some(v)) => Some(level("fallback_epsilon_per_km", v)?),
        (_, Some(_)) => {
            return Err(Rejection::invalid(
                "fallback_epsilon_per_km",
                "is only used under REQUESTS; leave it unset",
            ));
        }
    };
    if (epsilon.is_some() || fallback.is_some())
        && !cfg.params.region.contains_point(req.lat, req.lon)
    {
        return Err(Rejection::invalid(
            "lat",
            "must lie inside location.geo_ind.region under GEO_IND (with lon)",
        ));
    }
    Ok((epsilon, fallback))
}

/// Checks one position update with the rules of a request's user id and position.
pub fn validate_update(update: PositionUpdate) -> Result<AdmittedUpdate, Rejection> {
    check_user_and_position(&update.user_id, update.lat, update.lon)?;
    Ok(AdmittedUpdate {
        user_id: update.user_id,
        lat: update.lat,
        lon: update.lon,
    })
}

fn check_user_and_position(user_id: &str, lat: f64, lon: f64) -> Result<(), Rejection> {
    if user_id.trim().is_empty() {
        return Err(Rejection::invalid("user_id", "must not be empty"));
    }
    if user_id.len() > MAX_USER_ID_BYTES {
        return Err(Rejection::invalid(
            "user_id",
            format!("must be at most {MAX_USER_ID_BYTES} bytes"),
        ));
    }
    if !lat.is_finite() || !(-90.0..=90.0).contains(&lat) {
        return Err(Rejection::invalid(
            "lat",
            // The value is not repeated: it may be a real position.
            "must be a finite latitude in [-90, 90] degrees",
        ));
    }
    if !lon.is_finite() || !(-180.0..=180.0).contains(&lon) {
        return Err(Rejection::invalid(
            "lon",
            "must be a finite longitude in [-180, 180] degrees",
        ));
    }
    Ok(())
}
