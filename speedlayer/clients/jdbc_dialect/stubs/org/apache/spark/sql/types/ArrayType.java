package org.apache.spark.sql.types;

public class ArrayType extends DataType {}
