package org.apache.spark.sql.types;

public abstract class DataType {}
