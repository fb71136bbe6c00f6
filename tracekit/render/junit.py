"""``tracekit check --junit FILE``: JUnit XML, one test case per check.

GitLab (``artifacts:reports:junit``), Jenkins and the GitHub test-report actions read this
format; a failed check is a ``<failure>`` whose message is the check's one line.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from tracekit.gate.checks import GateResult
from tracekit.text import for_xml


def render(result: GateResult) -> bytes:
    """The JUnit XML document of one gate result."""
    n_tests, n_failures = str(len(result.checks)), str(len(result.failures))
    suites = ET.Element("testsuites", name="tracekit check", tests=n_tests, failures=n_failures, errors="0")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=f"tracekit check {result.measures.source}",
        tests=n_tests,
        failures=n_failures,
        errors="0",
        skipped="0",
        time="0",
    )
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", name="schedule", value=result.measures.schedule_label)
    if result.config.baseline:
        ET.SubElement(properties, "property", name="baseline", value=str(result.config.baseline))
    for check in result.checks:
        case = ET.SubElement(suite, "testcase", classname="tracekit.check", name=check.id, time="0")
        if not check.passed:
            failure = ET.SubElement(case, "failure", message=check.line(), type="regression")
            failure.text = check.line()
    ET.SubElement(suite, "system-out").text = "\n".join([result.summary(), *result.lines()])
    # The run's path and the lines that quote it may hold what XML 1.0 forbids (ESC, NUL):
    # ElementTree would write those as they are and no parser would read the file back.
    for element in suites.iter():
        element.attrib.update((key, for_xml(value)) for key, value in element.attrib.items())
        if element.text:
            element.text = for_xml(element.text)
    ET.indent(suites)
    xml: bytes = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    return xml + b"\n"
