"""The AWS Price List API's GetProducts, served from a fixture in AWS's response format.

``price_list_fixture.json`` is a GetProducts response (``FormatVersion`` aws_v1 and
``PriceList``: a list of JSON *strings*, each a product with ``product.attributes``
and ``terms.OnDemand.<offer>.priceDimensions.<rate>.pricePerUnit.USD``, as botocore's
example and AWS return them). Its SageMaker training rows are the rates AWS published
after the June 2025 price cut (ml.p5.48xlarge 63.296, ml.p4d.24xlarge 25.25, us-west-2
and us-east-1); the Hosting and Notebook rows are stand-ins (not AWS's prices) that the
filters must leave out. It has no ml.p6-b200 row, so that type exercises "the API has no
price" (the shipped table's derived row is used, labelled).

GetProducts applies ``Filters`` as the API documents them (botocore's model):
TERM_MATCH and EQUALS on the whole value (TERM_MATCH case-insensitive), CONTAINS on a
substring, ANY_OF / NONE_OF on a comma-separated list of values; a field is one of the
product's attributes, or ``ServiceCode`` / ``productFamily`` / ``sku``. Pages of
``MaxResults`` (1-100, default 100) with an opaque ``NextToken``.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.local_backend.api import ApiError, validation

FIXTURE = Path(__file__).with_name("price_list_fixture.json")
TARGET = "AWSPriceListService"
FILTER_TYPES = ("TERM_MATCH", "EQUALS", "CONTAINS", "ANY_OF", "NONE_OF")


@functools.lru_cache(maxsize=4)
def _products(path: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return tuple((item, json.loads(item)) for item in data["PriceList"])


def _field(product: dict[str, Any], name: str) -> str | None:
    if name.lower() == "servicecode":
        return str(product.get("serviceCode", ""))
    inner = product.get("product") or {}
    if name in ("productFamily", "sku"):
        return str(inner.get(name, ""))
    value = (inner.get("attributes") or {}).get(name)
    return None if value is None else str(value)


def _matches(product: dict[str, Any], flt: dict[str, Any]) -> bool:
    kind, value = flt.get("Type"), str(flt.get("Value", ""))
    have = _field(product, str(flt.get("Field", "")))
    if kind == "NONE_OF":
        return have is None or have not in [v.strip() for v in value.split(",")]
    if have is None:
        return False
    if kind == "TERM_MATCH":
        return have.lower() == value.lower()
    if kind == "EQUALS":
        return have == value
    if kind == "CONTAINS":
        return value in have
    return have in [v.strip() for v in value.split(",")]  # ANY_OF


def get_products(request: dict[str, Any], fixture: Path = FIXTURE) -> dict[str, Any]:
    service = request.get("ServiceCode")
    if not service:
        raise validation("1 validation error detected: Value null at 'serviceCode' failed to "
                         "satisfy constraint: Member must not be null")
    filters = request.get("Filters") or []
    for f in filters:
        if f.get("Type") not in FILTER_TYPES or not f.get("Field") or "Value" not in f:
            raise validation(f"Invalid filter {f}: Type must be one of {', '.join(FILTER_TYPES)}"
                             ", with a Field and a Value.")
    if request.get("FormatVersion", "aws_v1") != "aws_v1":
        raise ApiError("InvalidParameterException", "FormatVersion: only aws_v1 is supported.")
    size = int(request.get("MaxResults") or 100)
    if not 1 <= size <= 100:
        raise validation("MaxResults must be between 1 and 100.")
    token = request.get("NextToken")
    try:
        start = int(base64.b64decode(token).decode()) if token else 0
    except ValueError:
        raise ApiError("InvalidNextTokenException", "The NextToken is invalid.") from None
    found = [item for item, product in _products(str(fixture))
             if _field(product, "ServiceCode") == service
             and all(_matches(product, f) for f in filters)]
    out: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": found[start:start + size]}
    if start + size < len(found):
        out["NextToken"] = base64.b64encode(str(start + size).encode()).decode()
    return out


def handle(operation: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON payload) of one Price List API call."""
    try:
        if operation != "GetProducts":
            raise ApiError("UnknownOperationException", f"The local backend serves the Price "
                           f"List API's GetProducts only, not {operation}.")
        return 200, get_products(json.loads(body or b"{}"))
    except ApiError as err:
        return err.status, err.payload()
