"""The console's pages as a Starlette app: topics, one topic (partitions, WAL tail, subscriptions
and their lag charted over time), the topic browser, brokers, pipelines, one pipeline, the speed
layer, and the two actions.

Handlers are plain functions, run by Starlette in its thread pool: they read the etcd cache and,
for the one page that needs it, storage, a Delta log tail or metrics endpoints. A source that
cannot be read is named in the page's problems and the rest renders. Every response says its
server time in a `Server-Timing` header (the benchmark and the browser test read it).
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from danube_core.errors import DanubeError, InvalidTopicNameError
from danube_core.message_page import read_message_page

from console import actions, pages
from console.metrics_scrape import scrape
from console.services import ConsoleServices
from console.topics import RECORD_INTERVAL_S, TopicRow

HERE = Path(__file__).resolve().parent
PAGE_NAMES = ("topics", "brokers", "pipelines", "speedlayer")


def timed(handler: Callable[..., Response]) -> Callable[..., Response]:
    """Adds `Server-Timing: app;dur=<ms>` to a handler's response."""

    @functools.wraps(handler)
    def wrapper(request: Request) -> Response:
        started = time.perf_counter()
        response = handler(request)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
        return response

    return wrapper


def build_app(services: ConsoleServices) -> Starlette:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(pages.FILTERS)
    config = services.config

    def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
        problems = [p for p in (services.etcd.problem, *context.pop("problems", ())) if p]
        return templates.TemplateResponse(request, template, {
            "problems": problems, "pages": PAGE_NAMES, "actions_enabled": config.actions_enabled, **context,
        }, status_code=status)

    @timed
    def topics_page(request: Request) -> Response:
        cache = services.etcd.cache
        namespaces = services.topics.namespaces(cache) if cache is not None else []
        owners = services.topics.owners(cache) if cache is not None else {}
        listed = {ns: services.topics.topics(cache, ns, owners) for ns in namespaces} if cache is not None else {}
        return render(request, "topics.html", page="topics", namespaces=listed)

    def find_topic(request: Request, template: str) -> tuple[str, TopicRow | None, Response | None]:
        """The topic the path names, or the page that says why there is none: 503 without the
        cache, 400 for a name no topic can have, 404 for a topic etcd does not hold."""
        name = f"/{request.path_params['namespace']}/{request.path_params['topic']}"
        cache = services.etcd.cache
        if cache is None:
            return name, None, render(request, template, 503, page="topics", name=name, topic=None, page_read=None)
        try:
            topic = services.topics.topic(cache, name)
        except InvalidTopicNameError as exc:
            return name, None, render(request, template, 400, page="topics", name=name, topic=None,
                                      page_read=None, problems=[str(exc)])
        if topic is None:
            return name, None, render(request, template, 404, page="topics", name=name, topic=None, page_read=None,
                                      problems=[f"topic {name} does not exist (deleted, or not created yet)"])
        return name, topic, None

    @timed
    def topic_page(request: Request) -> Response:
        name, topic, refused = find_topic(request, "topic.html")
        if topic is None:
            assert refused is not None
            return refused
        now = time.time()
        charts = {f"{s.topic}|{s.name}": services.lag_history.series(s.topic, s.name) for s in topic.subscriptions}
        growing = {f"{s.topic}|{s.name}" for s in topic.subscriptions if services.lag_history.growing(s.topic, s.name)}
        return render(request, "topic.html", page="topics", name=name, topic=topic, now=now, growing=growing,
                      record_interval_s=RECORD_INTERVAL_S,
                      charts_json=json.dumps(charts), problems=[p.wal.problem for p in topic.partitions if p.wal.problem])

    @timed
    def messages_page(request: Request) -> Response:
        name, topic, refused = find_topic(request, "messages.html")
        if topic is None:
            assert refused is not None
            return refused
        try:
            partition = pages.chosen_partition(topic, request.query_params.get("partition"))
            offset = pages.page_start(request.query_params.get("offset"), partition, config.page_messages)
        except pages.BadPageRequest as exc:
            return render(request, "messages.html", 400, page="topics", name=name, topic=topic, page_read=None,
                          problems=[str(exc)])
        cache = services.etcd.cache
        assert cache is not None  # find_topic read the topic from it
        read = read_message_page(cache, services.store, services.storage_keys, partition.topic, offset,
                                 config.page_messages, partition.wal.directory)
        rows = pages.decoded_rows(cache, partition.topic, read.messages)
        return render(request, "messages.html", page="topics", name=name, topic=topic, partition=partition,
                      page_read=read, rows=rows, size=config.page_messages,
                      problems=[read.stopped] if read.stopped else [])

    @timed
    def brokers_page(request: Request) -> Response:
        cache = services.etcd.cache
        rows = services.brokers.brokers(cache) if cache is not None else []
        scrapes = {b.broker_id: scrape(b.registration.prom_exporter, config.metrics_timeout_ms / 1000)
                   for b in rows if b.registration is not None and b.registration.prom_exporter}
        return render(request, "brokers.html", page="brokers", brokers=rows, scrapes=scrapes,
                      problems=[s.problem for s in scrapes.values() if s.problem])

    @timed
    def pipelines_page(request: Request) -> Response:
        cache = services.etcd.cache
        rows = [pages.pipeline_summary(services, cache, p) for p in services.pipelines]
        return render(request, "pipelines.html", page="pipelines", pipelines=rows,
                      problems=[p.problem for p in services.pipelines if p.problem])

    @timed
    def pipeline_page(request: Request) -> Response:
        found = services.pipeline(request.path_params["name"])
        if found is None or found.config is None:
            return render(request, "pipeline.html", 404, page="pipelines", detail=None,
                          problems=[found.problem if found is not None else
                                    f"no pipeline {request.path_params['name']!r} in the console's configuration"])
        detail = pages.pipeline_detail(services, services.etcd.cache, found)
        return render(request, "pipeline.html", page="pipelines", detail=detail, problems=detail.problems)

    @timed
    def speedlayer_page(request: Request) -> Response:
        cache = services.etcd.cache
        state = services.speedlayer.state(cache) if cache is not None else None
        gateways = [pages.gateway_figures(scrape(e, config.metrics_timeout_ms / 1000))
                    for e in config.speedlayer.metrics]
        problems = [g.problem for g in gateways if g.problem] + (state.problems if state is not None else [])
        tails: dict[str, list[pages.TailFigures]] = {}  # "tenant/dataset" -> its tail on each worker
        for tenant in state.tenants if state is not None else []:
            followed = [d.dataset for d in tenant.datasets if d.spec is not None and d.spec.tail]
            if not followed:
                continue
            scrapes = {w.worker: scrape(w.record.metrics_address, config.metrics_timeout_ms / 1000)
                       for w in tenant.workers if w.record.metrics_address}
            problems += [s.problem for s in scrapes.values() if s.problem]
            tails.update({f"{tenant.tenant}/{d}": pages.tail_figures(scrapes, d) for d in followed})
        return render(request, "speedlayer.html", page="speedlayer", state=state, gateways=gateways,
                      tails=tails, masters=config.speedlayer.masters, problems=problems)

    async def action(request: Request) -> Response:
        form = {k: v[-1] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")).items()}
        token = request.headers.get("x-console-token") or form.get("token")
        kind = request.path_params["action"]
        try:
            actions.check_allowed(config, token)
            if kind == "admit":
                result = await run_in_threadpool(actions.admit, config, form.get("tenant", ""),
                                                 form.get("dataset", ""), form.get("table_uri", ""),
                                                 int(form.get("replication") or 0))
            elif kind == "drain":
                result = await run_in_threadpool(actions.drain, config, form.get("tenant", ""), form.get("worker", ""))
            else:
                return render(request, "action.html", 404, page="speedlayer", result=None,
                              problems=[f"no action {kind!r}"])
        except actions.ActionRefused as exc:
            return render(request, "action.html", 403, page="speedlayer", result=None, problems=[str(exc)])
        except (DanubeError, ValueError) as exc:
            return render(request, "action.html", 502, page="speedlayer",
                          result=actions.ActionResult(kind, False, str(exc)))
        return render(request, "action.html", 200 if result.ok else 502, page="speedlayer", result=result)

    def health(request: Request) -> Response:
        problem = services.etcd.problem
        return JSONResponse({"etcd": problem or "ok"}, status_code=200 if problem is None else 503)

    routes = [
        Route("/", lambda request: RedirectResponse("/topics")),
        Route("/topics", topics_page),
        Route("/topics/{namespace}/{topic}", topic_page),
        Route("/topics/{namespace}/{topic}/messages", messages_page),
        Route("/brokers", brokers_page),
        Route("/pipelines", pipelines_page),
        Route("/pipelines/{name}", pipeline_page),
        Route("/speedlayer", speedlayer_page),
        Route("/actions/{action}", action, methods=["POST"]),
        Route("/healthz", health),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    return Starlette(routes=routes)
