//! The analyst's workbench: its HTTP API and the page in headless Chromium.

mod api;
mod browser;
mod journey;
mod props;
mod security;
